"""The HTML report: one self-contained file, no network.

Plotly's JavaScript is inlined from the plotly package (docs/reports.md says
why plotly), figure data is embedded as JSON, and every plot sits above the
table it comes from. Text from the traced host (comm, symbols, hostnames) is
HTML-escaped (`render.safe.markup`) in the page and made inert for Plotly in the
figures (`render.safe.plot_figure`, the only way a figure is built), and the
embedded JSON has `<`, `>` and `&` escaped so no string can close the script
element. The Content-Security-Policy lets nothing be fetched or sent and runs
only the page's two inline scripts, by hash. Nothing here computes: the report
document and the series come from the analyses.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

from gputrace.render import html_plots, safe
from gputrace.render.safe import PlotFigure
from gputrace.units import format_bytes

Col = tuple[str, str, Callable[[Any], str]]

STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1200px;color:#222}
h1{font-size:1.5em}h2{font-size:1.15em;border-bottom:1px solid #ccc;margin-top:1.6em}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
td,th{border:1px solid #ddd;padding:2px 8px;text-align:right}
th{background:#f4f4f4}td.t{text-align:left}
.warn{background:#fff0f0;border:2px solid #c00;padding:.5em 1em;margin:.5em 0}
.note{color:#555;font-style:italic}.nr{color:#a60;font-weight:bold}
dl{display:grid;grid-template-columns:max-content auto;gap:2px 12px}dt{font-weight:bold}
"""


def esc(value: Any) -> str:
    """Text as HTML, every markup character escaped and every control or bidi character
    shown as a visible escape (`render.safe.markup`)."""
    return safe.markup(value)


def _script_hash(script: str) -> str:
    """The CSP source that lets exactly this inline script run."""
    digest = hashlib.sha256(script.encode("utf-8")).digest()
    return f"'sha256-{base64.b64encode(digest).decode('ascii')}'"


def csp(scripts: Sequence[str]) -> str:
    """The page's Content-Security-Policy: nothing fetched, sent or framed; only
    `scripts` run (so no injected script or inline event handler would); styles inline
    (Plotly writes its own style element and attributes); images only as data: URLs
    (Plotly's PNG download)."""
    return ("default-src 'none'; script-src " + " ".join(_script_hash(s) for s in scripts)
            + "; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; "
              "form-action 'none'")


def human_bytes(n: Any) -> str:
    """Bytes in binary units (1.5 GiB), exact below 1 KiB; '' for None."""
    return format_bytes(n, none="")


def num(v: Any) -> str:
    if v is None:
        return ""
    return f"{v:,}" if isinstance(v, int) else f"{v:,.6g}" if isinstance(v, float) else esc(v)


def text(v: Any) -> str:
    return esc(v)


def table(rows: Sequence[dict[str, Any]], cols: Sequence[Col], limit: int = 50) -> str:
    """An HTML table of `rows` (at most `limit` rows; the count of the rest is said)."""
    if not rows:
        return '<p class="note">no rows</p>'
    head = "".join(f"<th>{esc(title)}</th>" for _, title, _ in cols)
    body = []
    for r in rows[:limit]:
        cells = "".join(
            f'<td class="t">{f(r.get(k))}</td>' if f is text else f"<td>{f(r.get(k))}</td>"
            for k, _, f in cols)
        body.append(f"<tr>{cells}</tr>")
    more = (f'<p class="note">{len(rows) - limit} more rows in --format json</p>'
            if len(rows) > limit else "")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>{more}"


def not_recorded(what: str) -> str:
    return f'<p class="nr">{esc(what)}: not recorded in this trace</p>'


class Page:
    """Sections and figures of one HTML page, rendered by `html()`."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.parts: list[str] = []
        self.figures: list[PlotFigure] = []

    def add(self, markup: str) -> None:
        self.parts.append(markup)

    def section(self, title: str, fig: PlotFigure | None, missing: str | None,
                tables: str) -> None:
        """A plot (or why there is none) with its table(s) under it. The figure is a
        `PlotFigure`: only `render.safe.plot_figure` makes one (mypy checks it)."""
        self.add(f"<section><h2>{esc(title)}</h2>")
        if fig is not None:
            self.add(f'<div class="plot" id="plot{len(self.figures)}"></div>')
            self.figures.append(fig)
        elif missing:
            self.add(missing)
        self.add(tables + "</section>")

    def html(self) -> str:
        from plotly.offline import get_plotlyjs  # type: ignore[import-untyped]

        figs = json.dumps(self.figures, separators=(",", ":"), allow_nan=False)
        figs = figs.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
        boot = ("const F=" + figs + ";let n=0;Promise.all(F.map((f,i)=>Plotly.newPlot("
                "'plot'+i,f.data,f.layout,{displaylogo:false,responsive:true})"
                ".then(()=>{n++;}))).then(()=>{document.body.dataset.plotsRendered=n;});")
        plotly_js = get_plotlyjs()
        return (f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
                f"<meta http-equiv=Content-Security-Policy content=\"{csp([plotly_js, boot])}\">"
                f"<title>{esc(self.title)}</title><style>{STYLE}</style>"
                f"<script>{plotly_js}</script></head><body data-plots={len(self.figures)}>"
                + "".join(self.parts) + f"<script>{boot}</script></body></html>\n")


def header(page: Page, info: dict[str, Any], doc: dict[str, Any]) -> None:
    """The trace's identity: host, driver, GPUs, layers, status, drops, warnings."""
    tr = doc.get("trace") or {}
    host = info.get("host") or {}
    gpus = ", ".join(f"{g.get('index')}: {g.get('name') or '?'} "
                     f"({human_bytes(g.get('memory_bytes'))})"
                     for g in info.get("gpus") or []) or "none recorded"
    facts = [("trace", info.get("path")), ("host", host.get("hostname")),
             ("kernel", host.get("kernel")), ("driver", info.get("driver_version")),
             ("GPUs", gpus), ("layers", ", ".join(tr.get("layers") or info.get("layers") or [])),
             ("status", tr.get("status")), ("started", info.get("start_wall")),
             ("duration", f"{tr.get('duration_s', 0):.3f} s"),
             ("gputrace", info.get("gputrace_version"))]
    page.add(f"<h1>{esc(page.title)}</h1><dl>"
             + "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in facts) + "</dl>")
    if tr.get("synthetic"):
        page.add('<p class="warn">This trace is SYNTHETIC (made by a script, not recorded).</p>')
    drops = {k: v for k, v in (tr.get("drops") or {}).items() if v}
    if drops:
        page.add('<div class="warn"><b>Events were lost:</b> '
                 + ", ".join(f"{esc(k)}={v:,}" for k, v in sorted(drops.items()))
                 + " dropped by full ring buffers; counts are lower bounds and a dropped "
                 "free looks like a leak.</div>")
    if doc.get("warnings"):
        page.add('<div class="warn"><b>Warnings</b><ul>'
                 + "".join(f"<li>{esc(w)}</li>" for w in doc["warnings"]) + "</ul></div>")


def render_html(doc: dict[str, Any], series: dict[str, Any], info: dict[str, Any]) -> str:
    """The analyze report as one self-contained HTML page."""
    from gputrace.render.html_sections import sections

    page = Page(f"gputrace report: {info.get('path') or 'trace'}")
    header(page, info, doc)
    sections(page, doc, series)
    return page.html()


__all__ = ["Page", "esc", "header", "html_plots", "human_bytes", "num", "render_html", "table",
           "text"]
