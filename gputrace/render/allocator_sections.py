"""Terminal sections of the allocator reports (tensors, allocator-pool,
allocator-growth): a headline line and tables. Formats values; computes nothing."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

from gputrace.render.cells import hexa, human_bytes, num, plain
from gputrace.render.term_table import table


def _site(site: Any) -> str:
    """A stack's site: the first frame of the user's own code (the full stack is in the
    JSON and HTML reports)."""
    return "(no stack recorded)" if site is None else str(site)


def _pid(v: Any) -> str:
    return "-" if v is None else plain(v)


def tensors_section(con: Console, d: dict[str, Any], limit: int) -> None:
    pending = (f"; {num(d['pending_free_count'])} freed but pending on another stream "
               f"({human_bytes(d['pending_free_bytes'])})" if d["pending_free_count"] else "")
    con.print(Text(f"alive: {num(d['total_count'])} tensors, {human_bytes(d['total_bytes'])} "
                   f"from {num(d['stacks'])} stacks{pending}"))
    table(con, "Tensors alive by allocating stack", d["by_stack"], [
        ("bytes", "bytes", human_bytes), ("count", "tensors", num), ("device", "dev", num),
        ("pid", "pid", _pid), ("top_frame", "allocated at", _site)], limit)


def pool_section(con: Console, d: dict[str, Any], limit: int) -> None:
    con.print(Text(
        f"reserved {human_bytes(d['reserved_bytes'])} in {num(d['segment_count'])} segments, "
        f"allocated {human_bytes(d['allocated_bytes'])}; reserved but unallocated "
        f"{human_bytes(d['reserved_unallocated_bytes'])}, largest free block "
        f"{human_bytes(d['largest_inactive_bytes'])}"))
    table(con, "Per pool", d["pools"], [
        ("device", "dev", num), ("pool", "pool", str), ("segments", "segments", num),
        ("reserved_bytes", "reserved", human_bytes),
        ("allocated_bytes", "allocated", human_bytes),
        ("reserved_unallocated_bytes", "unallocated", human_bytes),
        ("largest_inactive_bytes", "largest free", human_bytes),
        ("fragmentation", "fragmentation", num)], limit)
    table(con, "Per segment (most unallocated first)", d["segments"], [
        ("address", "address", hexa), ("device", "dev", num), ("pool", "pool", str),
        ("reserved_bytes", "reserved", human_bytes),
        ("allocated_bytes", "allocated", human_bytes),
        ("reserved_unallocated_bytes", "unallocated", human_bytes),
        ("largest_inactive_bytes", "largest free", human_bytes)], limit)


def growth_section(con: Console, d: dict[str, Any], limit: int) -> None:
    if not d["entries"]:
        con.print(Text("no trace entries in the snapshot"))
        return
    rate = d["growth_bytes_per_s"]
    con.print(Text(
        f"{num(d['entries'])} trace entries over {num(d['span_s'])} s: active "
        f"{human_bytes(d['start_active_bytes'])} -> {human_bytes(d['end_active_bytes'])} "
        f"(peak {human_bytes(d['peak_active_bytes'])}, "
        f"{'+' if d['growth_bytes'] >= 0 else '-'}{human_bytes(abs(d['growth_bytes']))}"
        + (f", {human_bytes(rate)}/s" if rate is not None and rate > 0 else "") + "); reserved "
        f"{human_bytes(d['start_reserved_bytes'])} -> {human_bytes(d['end_reserved_bytes'])}"))
    table(con, "Retained (allocated in the history, not freed) by stack", d["by_stack"], [
              ("retained_bytes", "retained", human_bytes), ("retained_count", "kept", num),
              ("allocs", "allocs", num), ("retained_bytes_per_alloc", "per alloc", human_bytes),
              ("top_frame", "allocated at", _site)], limit)
