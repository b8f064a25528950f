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

from gputrace.render import cells, html_plots, safe
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
    """A number as the terminal writes it (`render.cells.num`: 1,234, 0.474, yes/no);
    '' for None."""
    return "" if v is None else esc(cells.num(v))


def pid(v: Any) -> str:
    """A process id, as the terminal writes it (no thousands separator); '' for None."""
    return "" if v is None else esc(cells.plain(v))


def yes_no(v: Any) -> str:
    """A flag as the terminal writes it: yes, no, '' for None."""
    return "" if v is None else "yes" if v else "no"


def bytes_per_min(v: Any) -> str:
    """A rate in bytes per minute, as the terminal writes one (`1.2 GiB/min`)."""
    if v is None:
        return ""
    return ("-" if v < 0 else "") + format_bytes(abs(int(v))) + "/min"


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
            f'<td class="t">{f(r.get(k))}</td>' if f is text or getattr(f, "left", False)
            else f"<td>{f(r.get(k))}</td>"
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


def _gpu(g: dict[str, Any]) -> str:
    """One GPU as the header lists it: `0: NVIDIA H200 (139.8 GiB)`, leaving out what the
    trace does not know."""
    name, mem = g.get("name"), g.get("memory_bytes")
    return (f"{g.get('index')}" + (f": {name}" if name else "")
            + (f" ({human_bytes(mem)})" if mem else ""))


IMPORT_BOOKKEEPING = frozenset({"kind", "file", "bytes", "compression", "sha256", "unix_s",
                                "gputrace_version", "joined", "layer"})
"""Keys of a manifest's `imported` entry that say how the file was read, not what it holds."""


def _imported(entry: dict[str, Any]) -> list[tuple[str, Any]]:
    """The facts an imported file gives (a snapshot: its format, allocator settings,
    devices), each as it was written down."""
    facts: list[tuple[str, Any]] = [("imported", f"{entry.get('kind')} {entry.get('file')}"
                                     + (" (joined)" if entry.get("joined") else ""))]
    for k, v in entry.items():
        if k in IMPORT_BOOKKEEPING or v in (None, "", [], {}):
            continue
        if isinstance(v, dict):
            v = ", ".join(f"{a}={cells.num(b)}" for a, b in v.items()
                          if not isinstance(b, (dict, list)))
        elif isinstance(v, list):
            v = ", ".join(cells.num(x) for x in v)
        else:
            v = cells.num(v)
        facts.append((k.replace("_", " "), v))
    return facts


def header(page: Page, info: dict[str, Any], doc: dict[str, Any],
           devices: Sequence[int] = ()) -> None:
    """The trace's identity: what it gives (host, kernel, driver, GPUs for a recording;
    the imported file's facts and devices for a snapshot), layers, status, drops,
    warnings. A fact the trace lacks is left out, not written blank."""
    tr = doc.get("trace") or {}
    host = info.get("host") or {}
    duration = tr.get("duration_s", info.get("duration_s"))
    facts: list[tuple[str, Any]] = [
        ("trace", info.get("path")), ("host", host.get("hostname")),
        ("kernel", host.get("kernel")), ("driver", info.get("driver_version")),
        ("GPUs", ", ".join(_gpu(g) for g in info.get("gpus") or [])),
        ("devices", ", ".join(str(d) for d in devices)),
        ("layers", ", ".join(tr.get("layers") or info.get("layers") or [])),
        ("status", tr.get("status")), ("started", info.get("start_wall")),
        ("duration", None if duration is None else f"{cells.num(float(duration))} s")]
    for entry in info.get("imported") or []:
        facts += _imported(entry)
    facts.append(("gputrace", info.get("gputrace_version")))
    page.add(f"<h1>{esc(page.title)}</h1><dl>"
             + "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in facts
                       if v not in (None, "", "?")) + "</dl>")
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
    header(page, info, doc, (series.get("allocator_state") or {}).get("devices") or ())
    sections(page, doc, series)
    return page.html()


__all__ = ["Page", "bytes_per_min", "esc", "header", "html_plots", "human_bytes", "num", "pid",
           "render_html", "table", "text", "yes_no"]
