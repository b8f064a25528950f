"""`gputrace diff` as terminal tables and as a self-contained HTML page: one table per
table of the diff document, in registry order (`analyses.diff.tables`)."""

from __future__ import annotations

from functools import partial
from typing import IO, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gputrace.analyses.diff import tables
from gputrace.render.html import Col, Page, esc, human_bytes, num, table, text
from gputrace.render.safe import printable_tree

TITLES = {"gpu_index": "GPU", "access_type": "access", "peak_bytes": "peak",
          "live_end_bytes": "live at end", "end_bytes": "end", "mean_per_s": "mean/s",
          "peak_per_s": "peak/s", "latency_ns_p50": "p50 ns", "latency_ns_p99": "p99 ns",
          "latency_ns_max": "max ns", "count": "calls"}


def _cell(d: dict[str, Any], is_bytes: bool) -> str:
    fmt = human_bytes if is_bytes else num
    b, a = fmt(d["before"]) or "-", fmt(d["after"]) or "-"
    pct = f" ({d['delta_pct']:+.1f}%)" if d["delta_pct"] is not None else ""
    return f"{b} -> {a}{pct}" if b != a else b


def _pair(d: dict[str, Any], is_bytes: bool) -> str:
    return esc(_cell(d, is_bytes))


def render_diff_terminal(d: dict[str, Any], out: IO[str], color: bool = False) -> None:
    """The diff as rich tables; 'no change' when the traces behave the same."""
    d = printable_tree(d)
    con = Console(file=out, color_system="auto" if color else None,
                  width=None if color else 100, highlight=False, markup=False)
    con.print(Text(f"gputrace diff: {d['before_trace']} -> {d['after_trace']}", style="bold"))
    for w in d["warnings"]:
        con.print(Text(f"warning: {w}", style="yellow"))
    con.print(Text(f"leaked bytes: {_cell(d['leak_bytes'], True)}"))
    if d.get("not_compared"):
        con.print(Text(f"not compared: {', '.join(d['not_compared'])}"))
    if not d["changed"]:
        con.print(Text("no change"))
        return
    for _, dt in tables():
        keys, fields = dt.keys, dt.shown or dt.fields
        rows = d[dt.name]
        if not rows:
            continue
        t = Table(title=dt.title, title_justify="left")
        for k in (*keys, "status"):
            t.add_column(TITLES.get(k, k), overflow="fold", min_width=len(TITLES.get(k, k)))
        for f in fields:
            t.add_column(TITLES.get(f, f), justify="right", no_wrap=True)
        for r in rows:
            t.add_row(*("-" if r[k] is None else str(r[k]) for k in (*keys, "status")),
                      *(_cell(r[f], dt.is_bytes and f != "count") for f in fields))
        con.print(t)


def render_diff_html(d: dict[str, Any]) -> str:
    """The diff as one self-contained HTML page (tables only)."""
    page = Page(f"gputrace diff: {d['before_trace']} -> {d['after_trace']}")
    page.add(f"<h1>{esc(page.title)}</h1>")
    for w in d["warnings"]:
        page.add(f'<p class="warn">{esc(w)}</p>')
    page.add(f"<p>leaked bytes: {_pair(d['leak_bytes'], True)}</p>")
    if d.get("not_compared"):
        page.add(f"<p>not compared: {esc(', '.join(d['not_compared']))}</p>")
    if not d["changed"]:
        page.add("<p><b>no change</b></p>")
    for _, dt in tables():
        cols: list[Col] = [(k, TITLES.get(k, k), text) for k in (*dt.keys, "status")]
        cols += [(f, TITLES.get(f, f), partial(_pair, is_bytes=dt.is_bytes and f != "count"))
                 for f in dt.shown or dt.fields]
        page.section(dt.title, None, None, table(d[dt.name], cols))
    return page.html()
