"""How does the terminal show the leak report: the joined view (each piece of memory
once, one leaked-bytes figure, sub-allocation explained), the growth table, and
the per-layer view (`--by-layer`)?
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

from gputrace.render.cells import hexa, human_bytes, num, plain, short_kind
from gputrace.render.holder_sections import no_live_owner
from gputrace.render.term_table import table

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


def _kept_line(name: str, v: dict[str, Any]) -> str:
    """One sentence for the memory a caching allocator keeps by design."""
    n, size = num(v["count"]), human_bytes(v["bytes"])
    if name == "cublas":
        what = f"a {size} workspace" if v["count"] == 1 else f"{n} workspaces, {size}"
        return f"cuBLAS holds {what} (cached by design, freed at exit); not a leak"
    return (f"held by {v['label']}: {n} segments, {size} reserved (cached by design, "
            "freed at exit); not a leak")


def leaks_section(con: Console, d: dict[str, Any], limit: int) -> None:
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
        ("site", "site", plain)], limit)
    left_out(con, d, "leak_sites")
    folded = f"Leaked memory (each piece once; {TIMES}: identical pieces folded into the row)"
    table(con, folded, d["leaked"], [
        ("pid", "pid", plain), ("comm", "comm", str), ("kind", "kind", short_kind),
        ("what", "what", str), ("api_count", "allocs", num), ("bytes", "leaked", human_bytes),
        ("rm_bytes", "driver", human_bytes), ("pieces", TIMES, num), ("age_s", "age s", num),
        ("site", "site", plain)], limit)
    left_out(con, d, "leaked")
    for name, v in sorted((d.get("held_by_allocator") or {}).items()):
        con.print(Text(_kept_line(name, v)))
    for g in d.get("growth_by_allocator") or []:
        if g["flagged"] and g["allocator"] in (d.get("held_by_allocator") or {}):
            by = [plain(s["trigger"] or "?") for s in d.get("allocator_sites") or []
                  if s["allocator"] == g["allocator"] and s["pid"] == g["pid"]][:3]
            con.print(Text(f"growing: {d['held_by_allocator'][g['allocator']]['label']} "
                           f"(pid {g['pid']}) adds memory, {human_bytes(g['slope_bytes_per_min'])}"
                           f"/min, asked for by {', '.join(by) or '?'}"))
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
    no_live_owner(con, d.get("no_live_owner"), limit)
    growth_section(con, d, limit)
    con.print(Text("per-layer view (api, rm, uvm rows apart): --by-layer", style="dim"))


def left_out(con: Console, d: dict[str, Any], key: str) -> None:
    """How many rows of a list the report itself did not keep (--top, or its bound);
    the totals still count them."""
    n = (d.get("left_out") or {}).get(key)
    if n:
        con.print(Text(f"... {num(n)} more rows not kept by the report (--top or its bound; "
                       "the totals count them)", style="dim"))


def growth_section(con: Console, d: dict[str, Any], limit: int) -> None:
    table(con, "Growth (live bytes over time)", d["growth"], [
        ("layer", "layer", str), ("pid", "pid", plain), ("peak_bytes", "peak", human_bytes),
        ("end_bytes", "end", human_bytes), ("slope_bytes_per_min", "slope/min", human_bytes),
        ("r2", "R²", num), ("rising_troughs", "rises", num), ("flagged", "growing", num)],
        limit)
    left_out(con, d, "growth")


def leaks_by_layer_section(con: Console, d: dict[str, Any], limit: int) -> None:
    con.print(Text("by layer (one allocation may appear in each layer): "
                   + ", ".join(f"{k} {human_bytes(v) if v is not None else 'not recorded'}"
                               for k, v in sorted(d["bytes_by_layer"].items()))))
    table(con, "Leaked allocations", d["allocations"], [
        ("layer", "layer", str), ("pid", "pid", plain), ("comm", "comm", str),
        ("kind", "kind", short_kind), ("what", "what", str), ("id", "id", hexa),
        ("size_bytes", "size", human_bytes), ("age_s", "age s", num),
        ("stack_id", "stack", num)], limit)
    left_out(con, d, "allocations")
    table(con, "By process", d["by_process"], [
        ("layer", "layer", str), ("pid", "pid", plain), ("comm", "comm", str),
        ("kind", "kind", str), ("count", "count", num), ("bytes", "bytes", human_bytes)], limit)
    left_out(con, d, "by_process")
    table(con, "By call stack", d["by_stack"], [
        ("layer", "layer", str), ("pid", "pid", plain), ("count", "count", num),
        ("bytes", "bytes", human_bytes), ("site", "site", str)], limit)
    left_out(con, d, "by_stack")
    table(con, "By size class", d["by_size_class"], [
        ("layer", "layer", str), ("size_class", "class", str), ("count", "count", num),
        ("bytes", "bytes", human_bytes)], limit)
    growth_section(con, d, limit)
    if d.get("rm_freed_by_fd_close"):
        c = d["rm_freed_by_fd_close"]
        con.print(f"[dim]RM memory never freed by the program, torn down by the driver when "
                  f"its control fd was released: {c['count']} ({human_bytes(c['bytes'])})"
                  "[/dim]")
    if d.get("rm_virtual_unreleased"):
        v = d["rm_virtual_unreleased"]
        con.print(f"[dim]RM virtual reservations not released (not memory, not counted): "
                  f"{v['count']} ({human_bytes(v['bytes'])})[/dim]")
