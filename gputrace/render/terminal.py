"""Reports as rich tables for a 100-column terminal. Formats values; computes nothing.

Every string of the document may come from the traced host (a process names
itself; symbols come from its binaries), so `render_terminal` first makes each
one `printable` (control characters escaped), and cells and messages are
handed to rich as plain text, never as markup: `[link=...]` in a `comm` stays
those characters.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TextIO

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from gputrace.analyses import registry
from gputrace.render.driver_sections import fault_rate_section, fragmentation_section
from gputrace.render.safe import printable_tree

Fmt = Callable[[Any], str]
WIDTH = 100
ROWS = 20


def human_bytes(v: Any) -> str:
    if v is None:
        return "-"
    n = float(v)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(v)


def num(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def us(v: Any) -> str:
    return "-" if v is None else f"{float(v) / 1000:,.1f}"


KIND_LABELS = {"alive_at_end": "alive", "unfreed_at_exit": "at exit"}


def short_kind(v: Any) -> str:
    return KIND_LABELS.get(str(v), str(v))


def plain(v: Any) -> str:
    return "-" if v is None else str(v)


def hexa(v: Any) -> str:
    return "-" if v is None else f"0x{int(v):x}"


Col = tuple[str, str, Fmt]


STACK_MIN = 24
"""Narrowest a trailing call-stack column gets before other columns are left out."""


def fit_columns(width: int, cols: Sequence[Col], cells: list[list[str]]
                ) -> tuple[list[int], list[int], bool]:
    """Which columns fit in `width` (indexes), the width of each, and whether the last is
    a free-text column (a call stack) that takes what is left, cut with an ellipsis.
    Columns are left out from the right, the first two (whose row it is) always stay,
    and nothing is ever wrapped, so a number is never broken over lines."""
    sizes = [max([cell_len(h), *(cell_len(row[i]) for row in cells)])
             for i, (_, h, _) in enumerate(cols)]
    last = len(cols) - 1
    free = cols[last][0] in STACK_KEYS
    keep = list(range(len(cols)))

    def used(i: int) -> int:
        return min(sizes[i], STACK_MIN) if free and i == last else sizes[i]

    while sum(used(i) for i in keep) + 3 * (len(keep) - 1) > width and len(keep) > 2:
        drop = keep[-2] if free and len(keep) > 3 else keep[-1]
        if free and drop == last:
            break
        keep.remove(drop)
    widths = [sizes[i] for i in keep]
    if free and last in keep:
        rest = width - sum(widths[:-1]) - 3 * (len(keep) - 1)
        widths[-1] = max(min(sizes[last], rest), min(sizes[last], STACK_MIN))
    return keep, widths, free


STACK_KEYS = ("frames", "stack")


def table(con: Console, title: str, rows: Sequence[dict[str, Any]], cols: Sequence[Col],
          limit: int = ROWS) -> None:
    if not rows:
        con.print(Text(f"{title}: none", style="dim"))
        return
    cells = [[f(r.get(k)) for k, _, f in cols] for r in rows[:limit]]
    keep, widths, _ = fit_columns(con.width, cols, cells)
    t = Table(title=Text(title), title_justify="left", expand=False, show_edge=False,
              pad_edge=False)
    for i, w in zip(keep, widths, strict=True):
        # Nothing wraps: ids, numbers and kinds broken over lines are unreadable; a call
        # stack too long for the terminal is cut (the whole of it is in json and html).
        t.add_column(cols[i][1], no_wrap=True, overflow="ellipsis", width=w)
    for row in cells:
        t.add_row(*(Text(row[i]) for i in keep))
    con.print(t)
    left = [cols[i][1] for i in range(len(cols)) if i not in keep]
    if left:
        con.print(Text(f"(too narrow for: {', '.join(left)}; --format json or html has them)",
                       style="dim"))
    if len(rows) > limit:
        con.print(f"[dim]... {len(rows) - limit} more (use --top or --format json)[/dim]")


TIMES = "\N{MULTIPLICATION SIGN}"
BASIS = {"api": "API allocations", "driver": "driver allocations",
         "api+driver": "API allocations, and driver allocations of processes without API calls"}


def _sub_allocation(s: dict[str, Any]) -> str | None:
    """The sentence explaining why a site's API bytes differ from the driver memory
    holding them, when they do."""
    if not s.get("backing_count") or s.get("backing_bytes") == s["bytes"]:
        return None

    def n_x(n: Any, size: Any, total: Any) -> str:
        if size is None:
            return f"{n} ({human_bytes(total)})"
        return f"{n} {TIMES} {human_bytes(size)}"

    return (f"{n_x(s['count'], s['size_bytes'], s['bytes'])} API allocations inside "
            f"{n_x(s['backing_count'], s['backing_size_bytes'], s['backing_bytes'])} driver "
            "allocations: the driver sub-allocates small API allocations from larger "
            "ones; the leaked figure counts the API bytes")


def _leaks(con: Console, d: dict[str, Any], limit: int) -> None:
    """The joined view: each piece of memory once, one leaked-bytes figure."""
    total = d["total_bytes"]
    con.print(Text(f"leaked: {human_bytes(total)} ({num(total)} bytes of "
                   f"{BASIS.get(d['total_basis'], d['total_basis'])}) in "
                   f"{num(d['total_count'])} allocations"))
    for s in d["leak_sites"][:limit]:
        note = _sub_allocation(s)
        if note:
            con.print(Text(note))
    table(con, "Leak sites", d["leak_sites"], [
        ("pid", "pid", plain), ("comm", "comm", str), ("what", "what", str),
        ("count", "count", num), ("bytes", "bytes", human_bytes),
        ("frames", "call stack (innermost first)", plain)], limit)
    table(con, "Leaked memory (each piece once)", d["leaked"], [
        ("pid", "pid", plain), ("comm", "comm", str), ("kind", "kind", short_kind),
        ("what", "what", str), ("api_count", "allocs", num), ("bytes", "leaked", human_bytes),
        ("rm_bytes", "driver", human_bytes), ("age_s", "age s", num),
        ("frames", "call stack (innermost first)", plain)], limit)
    held = d.get("driver_held")
    for kind, v in sorted((held or {}).get("by_kind", {}).items()):
        how = ("released by the driver at exit" if kind == "unfreed_at_exit"
               else "still held at the end of the trace")
        con.print(Text(f"driver memory the program never asked for through the API (CUDA "
                       f"context and runtime), {how}: {num(v['count'])} allocations "
                       f"({human_bytes(v['bytes'])}); not a leak"))
    if (c := d.get("rm_freed_by_fd_close")) and c["count"]:
        con.print(Text(f"RM memory never freed by the program, torn down by the driver when "
                       f"its control fd was released: {num(c['count'])} "
                       f"({human_bytes(c['bytes'])}); not a leak", style="dim"))
    for layer, v in sorted((d.get("reservations") or {}).items()):
        con.print(Text(f"address-space reservations not released ({layer}; not memory, not "
                       f"counted): {num(v['count'])} ({human_bytes(v['bytes'])})",
                       style="dim"))
    _growth(con, d, limit)
    con.print(Text("per-layer view (api, rm, uvm rows apart): --by-layer", style="dim"))


def _growth(con: Console, d: dict[str, Any], limit: int) -> None:
    table(con, "Growth (live bytes over time)", d["growth"], [
        ("layer", "layer", str), ("pid", "pid", plain), ("peak_bytes", "peak", human_bytes),
        ("end_bytes", "end", human_bytes), ("slope_bytes_per_min", "slope/min", human_bytes),
        ("r2", "R²", num), ("rising_troughs", "rises", num), ("flagged", "growing", num)],
        limit)


def _leaks_by_layer(con: Console, d: dict[str, Any], limit: int) -> None:
    con.print(Text("by layer (one allocation may appear in each layer): "
                   + ", ".join(f"{k} {human_bytes(v) if v is not None else 'not recorded'}"
                               for k, v in sorted(d["bytes_by_layer"].items()))))
    table(con, "Leaked allocations", d["allocations"], [
        ("layer", "layer", str), ("pid", "pid", plain), ("comm", "comm", str),
        ("kind", "kind", short_kind), ("what", "what", str), ("id", "id", hexa),
        ("size_bytes", "size", human_bytes), ("age_s", "age s", num),
        ("stack_id", "stack", num)], limit)
    table(con, "By process", d["by_process"], [
        ("layer", "layer", str), ("pid", "pid", plain), ("comm", "comm", str),
        ("kind", "kind", str), ("count", "count", num), ("bytes", "bytes", human_bytes)], limit)
    table(con, "By call stack", d["by_stack"], [
        ("layer", "layer", str), ("pid", "pid", plain), ("count", "count", num),
        ("bytes", "bytes", human_bytes), ("frames", "frames (innermost first)", str)], limit)
    table(con, "By size class", d["by_size_class"], [
        ("layer", "layer", str), ("size_class", "class", str), ("count", "count", num),
        ("bytes", "bytes", human_bytes)], limit)
    _growth(con, d, limit)
    if d.get("rm_freed_by_fd_close"):
        c = d["rm_freed_by_fd_close"]
        con.print(f"[dim]RM memory never freed by the program, torn down by the driver when "
                  f"its control fd was released: {c['count']} ({human_bytes(c['bytes'])})"
                  "[/dim]")
    if d.get("rm_virtual_unreleased"):
        v = d["rm_virtual_unreleased"]
        con.print(f"[dim]RM virtual reservations not released (not memory, not counted): "
                  f"{v['count']} ({human_bytes(v['bytes'])})[/dim]")


def _summary(con: Console, d: dict[str, Any], limit: int) -> None:
    if d["ioctls"] is not None:
        table(con, "ioctls (latency in µs)", d["ioctls"], [
            ("device", "device", str), ("gpu_index", "gpu", num), ("name", "command", str),
            ("count", "count", num), ("failed", "failed", num), ("total_ns", "total", us),
            ("latency_ns_p50", "p50", us), ("latency_ns_p90", "p90", us),
            ("latency_ns_p99", "p99", us), ("latency_ns_max", "max", us)], limit)
    table(con, "Memory per process", d["processes"], [
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


REPORT_FIELDS = ("question", "recorded", "not_recorded_layers", "warnings")


def _generic(con: Console, d: dict[str, Any], limit: int) -> None:
    """A report without a section of its own: each figure on a line, each list of rows
    a table (columns from its first row)."""
    for k, v in d.items():
        if k in REPORT_FIELDS:
            continue
        if isinstance(v, list) and all(isinstance(r, dict) for r in v):
            cols = list(v[0]) if v else []
            table(con, k, v, [(c, c, num) for c in cols], limit)
        elif not isinstance(v, (dict, list)):
            con.print(Text(f"{k}: {num(v)}"))


SECTIONS: dict[str, Callable[[Console, dict[str, Any], int], None]] = {
    "leaks": _leaks, "fault_rate": fault_rate_section,
    "fragmentation": fragmentation_section, "summary": _summary}
"""The section of each report (by JSON key); titles and order are the registry's
(gputrace/analyses/registry.py), and a report with no section here gets `_generic`."""


def _warn(con: Console, text: str) -> None:
    con.print(Text.assemble(("warning:", "yellow"), " ", text))


def render_terminal(document: dict[str, Any], out: TextIO, *, color: bool = True,
                    top: int | None = None, by_layer: bool = False,
                    width: int | None = None) -> None:
    """Print every report in `document` (the JSON document's shape); `by_layer`: the
    leak report's per-layer view (api, rm, uvm apart) instead of the joined one; `width`:
    the terminal's columns (WIDTH when not a terminal), tables leave out what won't fit."""
    con = Console(file=out, width=max(width or WIDTH, 40), force_terminal=color, no_color=not color,
                  highlight=False, soft_wrap=False, emoji=False)
    document = printable_tree(document)
    limit = top if top is not None else ROWS
    for w in document["warnings"]:
        _warn(con, w)
    for spec in registry.REPORTS:
        key = spec.key
        rep = document.get(key)
        if rep is None:
            continue
        fn = SECTIONS.get(key, _generic)
        con.rule(f"[bold]{spec.title}[/bold]")
        con.print(Text(rep["question"], style="dim"))
        for w in rep["warnings"]:
            if w not in document["warnings"]:
                _warn(con, w)
        if not rep["recorded"]:
            con.print(Text("not recorded: layer(s) " + ", ".join(rep["not_recorded_layers"])
                           + " missing from this trace"))
            continue
        (_leaks_by_layer if by_layer and key == "leaks" else fn)(con, rep, limit)
