"""Reports as rich tables for a 100-column terminal. Formats values; computes nothing.

This module prints the document: one section per report, in registry order, the
section a report's registry entry names (`ReportSpec.terminal`: leak_sections,
fault_fragmentation_sections, allocator_sections, oom_sections, `summary_section`
here) or, for a report with none, the generic one here; values are written by cells and
tables fitted to the width by term_table.

Every string of the document may come from the traced host (a process names
itself; symbols come from its binaries), so `render_terminal` first makes each
one `printable` (control characters escaped), and cells and messages are
handed to rich as plain text, never as markup: `[link=...]` in a `comm` stays
those characters.
"""

from __future__ import annotations

from typing import Any, TextIO

from rich.console import Console
from rich.text import Text

from gputrace.analyses import registry
from gputrace.analyses.report import REPORT_FIELDS
from gputrace.analyses.report_spec import GROUPINGS, ReportSpec, resolve
from gputrace.render.cells import by_name, human_bytes, num, plain, us
from gputrace.render.safe import printable_tree
from gputrace.render.term_table import ROWS, table

WIDTH = 100


def summary_section(con: Console, d: dict[str, Any], limit: int) -> None:
    """The summary report: ioctl latency, memory per process and per GPU."""
    if d["ioctls"] is not None:
        table(con, "ioctls (latency in µs)", d["ioctls"], [
            ("device", "device", str), ("gpu_index", "gpu", num), ("name", "command", str),
            ("count", "count", num), ("failed", "failed", num), ("total_ns", "total", us),
            ("latency_ns_p50", "p50", us), ("latency_ns_p90", "p90", us),
            ("latency_ns_p99", "p99", us), ("latency_ns_max", "max", us)], limit)
    if d.get("held") is not None:  # a report of an older gputrace has none
        table(con, "Memory per process (each piece once)", d["held"], [
            ("pid", "pid", plain), ("comm", "comm", str),
            ("peak_bytes", "peak", human_bytes), ("live_end_bytes", "held at end", human_bytes),
            ("program_bytes", "program", human_bytes),
            ("allocator_pool_bytes", "pool", human_bytes),
            ("cuda_context_bytes", "context", human_bytes),
            ("driver_only_bytes", "driver-only", human_bytes)], limit)
    table(con, "Memory per process by layer (a breakdown)", d["processes"], [
        ("layer", "layer", str), ("pid", "pid", plain), ("comm", "comm", str),
        ("allocations", "allocs", num), ("peak_bytes", "peak", human_bytes),
        ("live_end_bytes", "live at end", human_bytes)], limit)
    g = d["gpus"]
    if g is not None:
        table(con, f"Memory per GPU (from {g['source']})", g["gpus"], [
            ("gpu_index", "gpu", num), ("peak_bytes", "peak", human_bytes),
            ("end_bytes", "end", human_bytes), ("memory_bytes", "memory", human_bytes),
            ("peak_share", "peak share", num), ("full", "full", num)], limit)
        con.print(Text(f"imbalance across GPUs (max / mean): peak {num(g['imbalance_peak'])}, "
                       f"end {num(g['imbalance_end'])}"))


def generic_section(con: Console, spec: ReportSpec, d: dict[str, Any], limit: int) -> None:
    """A report without a section of its own: each figure on a line and each list of rows
    a table (its declared columns: `ReportSpec.columns_of`), in name order; nested values
    as text (`cells.num`), never a raw dict, list or bool."""
    for k, v in sorted(d.items()):
        if k in REPORT_FIELDS:
            continue
        if isinstance(v, list) and all(isinstance(r, dict) for r in v):
            table(con, k, v, [(c, c, by_name(c)) for c in spec.columns_of(k, v)], limit)
        else:  # a figure, or nested values written as text (never Python's repr)
            con.print(Text(f"{k}: {by_name(k)(v)}"))


def _warn(con: Console, text: str) -> None:
    con.print(Text.assemble(("warning:", "yellow"), " ", text))


def render_terminal(document: dict[str, Any], out: TextIO, *, color: bool = True,
                    rows: int | None = None, by_layer: bool = False,
                    width: int | None = None) -> None:
    """Print every report in `document` (the JSON document's shape), at most `rows` rows
    of each list (`analyze --rows`; the rest are counted); `by_layer`: the
    leak report's per-layer view (api, rm, uvm apart) instead of the joined one; `width`:
    the terminal's columns (WIDTH when not a terminal), tables leave out what won't fit."""
    con = Console(file=out, width=max(width or WIDTH, 40), force_terminal=color, no_color=not color,
                  highlight=False, soft_wrap=False, emoji=False)
    document = printable_tree(document)
    limit = rows if rows is not None else ROWS
    shown = set(document["warnings"])  # a set: reports repeat the trace's warnings
    for w in document["warnings"]:
        _warn(con, w)
    absent: list[str] = []
    doubts: list[str] = []
    for spec in registry.REPORTS:
        key = spec.key
        rep = document.get(key)
        if rep is None:
            continue
        if not rep["recorded"]:
            # a report of layers this trace lacks is one line at the end, not a section;
            # a doubt of its own (beyond "not recorded") is still said, there
            absent.append(f"{spec.title} ({', '.join(rep['not_recorded_layers'])})")
            doubts += [w for w in rep["warnings"]
                       if w not in shown and "nothing was measured" not in w]
            continue
        con.rule(f"[bold]{spec.title}[/bold]")
        con.print(Text(rep["question"], style="dim"))
        for w in rep["warnings"]:
            if w not in shown:
                _warn(con, w)
        path = (spec.terminal_by_layer if by_layer else None) or spec.terminal
        if path is not None:
            resolve(path)(con, rep, limit)
        else:
            generic_section(con, spec, rep, limit)
        groups_section(con, spec, rep, limit)
    if absent:
        con.rule()
        for w in dict.fromkeys(doubts):
            _warn(con, w)
        con.print(Text(not_recorded_line(absent)))


def not_recorded_line(absent: list[str]) -> str:
    """The one line that stands for every report whose layers the trace lacks."""
    return "not recorded in this trace (layers missing): " + "; ".join(absent)


def groups_section(con: Console, spec: ReportSpec, rep: dict[str, Any], limit: int) -> None:
    """A report's figures per pod or container (`analyze --by`), when it has them."""
    for by in GROUPINGS:
        rows = rep.get(f"by_{by}")
        if rows is not None:
            cols = spec.columns_of(f"by_{by}", rows)
            table(con, f"{spec.title} by {by}", rows, [
                (c, c, human_bytes if c.endswith("bytes") else num) for c in cols], limit)
