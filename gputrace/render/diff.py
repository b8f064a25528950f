"""`gputrace diff` as terminal tables and as a self-contained HTML page: one table per
table of the diff document, in registry order (`analyses.diff.tables`)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import IO, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gputrace.analyses.diff import tables
from gputrace.render import cells
from gputrace.render.html import Col, Page, esc, table, text
from gputrace.render.safe import printable_tree
from gputrace.units import format_bytes

TITLES = {"gpu_index": "GPU", "access_type": "access", "peak_bytes": "peak",
          "live_end_bytes": "live at end", "end_bytes": "end", "mean_per_s": "mean/s",
          "peak_per_s": "peak/s", "latency_ns_p50": "p50 ns", "latency_ns_p99": "p99 ns",
          "latency_ns_max": "max ns", "device": "dev", "reserved_bytes": "reserved",
          "allocated_bytes": "allocated", "reserved_unallocated_bytes": "unallocated",
          "largest_inactive_bytes": "largest free"}
"""Column titles as the reports' own tables write them."""
TABLE_TITLES = {"ioctl_latency": {"count": "calls"},
                "leak_sites": {"count": "allocations", "stack": "site"},
                "tensor_sites": {"count": "tensors", "top_frame": "allocated at"}}
"""Where a table's columns read otherwise (`count` counts calls, allocations or tensors,
as its report's own table says)."""


def _title(table: str, column: str) -> str:
    return TABLE_TITLES.get(table, {}).get(column) or TITLES.get(column, column)


def _fmt(name: str, is_bytes: bool) -> Callable[[Any], str]:
    """How a figure named `name` is written, as the terminal writes it: bytes, bytes per
    second, counts and ratios."""
    if name.endswith("bytes_per_s"):
        return lambda v: "" if v is None else format_bytes(int(v)) + "/s"
    if name.endswith("bytes_per_min"):
        return lambda v: "" if v is None else format_bytes(int(v)) + "/min"
    if (is_bytes and name not in ("count", "segments")) or name.endswith("bytes"):
        return lambda v: "" if v is None else format_bytes(int(v))
    return lambda v: "" if v is None else cells.num(v)


def _cell(d: dict[str, Any], is_bytes: bool, name: str = "") -> str:
    fmt = _fmt(name, is_bytes)
    b, a = fmt(d["before"]) or "-", fmt(d["after"]) or "-"
    pct = f" ({d['delta_pct']:+.1f}%)" if d["delta_pct"] is not None else ""
    return f"{b} -> {a}{pct}" if b != a else b


def _pair(d: dict[str, Any], is_bytes: bool, name: str = "") -> str:
    return esc(_cell(d, is_bytes, name))


def _row_cell(r: dict[str, Any], f: str, is_bytes: bool) -> str:
    """A figure of a row; a figures-table row (`field`, `value`) is written by its name."""
    return _cell(r[f], is_bytes, r["field"] if f == "value" and "field" in r else f)


def render_diff_terminal(d: dict[str, Any], out: IO[str], color: bool = False) -> None:
    """The diff as rich tables; 'no change' when the traces behave the same."""
    d = printable_tree(d)
    con = Console(file=out, color_system="auto" if color else None,
                  width=None if color else 100, highlight=False, markup=False)
    con.print(Text(f"gputrace diff: {d['before_trace']} -> {d['after_trace']}", style="bold"))
    for w in d["warnings"]:
        con.print(Text(f"warning: {w}", style="yellow"))
    con.print(Text(f"leaked bytes: {_cell(d['leak_bytes'], True, 'bytes')}"))
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
            title = _title(dt.name, k)
            t.add_column(title, overflow="fold", min_width=len(title))
        for f in fields:
            t.add_column(_title(dt.name, f), justify="right", no_wrap=True)
        for r in rows:
            t.add_row(*("-" if r[k] is None else str(r[k]) for k in (*keys, "status")),
                      *(_row_cell(r, f, dt.is_bytes) for f in fields))
        con.print(t)


def render_diff_html(d: dict[str, Any]) -> str:
    """The diff as one self-contained HTML page (tables only)."""
    page = Page(f"gputrace diff: {d['before_trace']} -> {d['after_trace']}")
    page.add(f"<h1>{esc(page.title)}</h1>")
    for w in d["warnings"]:
        page.add(f'<p class="warn">{esc(w)}</p>')
    page.add(f"<p>leaked bytes: {_pair(d['leak_bytes'], True, 'bytes')}</p>")
    if d.get("not_compared"):
        page.add(f"<p>not compared: {esc(', '.join(d['not_compared']))}</p>")
    if not d["changed"]:
        page.add("<p><b>no change</b></p>")
    for _, dt in tables():
        rows = d[dt.name]
        if not rows:
            continue
        cols: list[Col] = [(k, _title(dt.name, k), text) for k in (*dt.keys, "status")]
        if dt.keys == ("field",):  # a figures table: each row written by its own name
            page.section(dt.title, None, None, table(
                [dict(r, _v=_row_cell(r, "value", dt.is_bytes)) for r in rows],
                [*cols, ("_v", "value", esc)]))
            continue
        cols += [(f, _title(dt.name, f), partial(_pair, is_bytes=dt.is_bytes, name=f))
                 for f in dt.shown or dt.fields]
        page.section(dt.title, None, None, table(rows, cols))
    return page.html()
