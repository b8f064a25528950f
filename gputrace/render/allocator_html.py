"""The HTML sections of the allocator reports (tensors, allocator-pool, allocator-growth):
each site with its full stack a click away, the allocator's state over time per device
and the segment map. Formats values; computes nothing."""

from __future__ import annotations

from typing import Any

from gputrace.render import html_plots as plots
from gputrace.render.cells import hexa
from gputrace.render.html import Page, esc, human_bytes, num, table, text


def stack_cell(v: Any) -> str:
    """A site, and its full stack (innermost first) folded under it."""
    if not v or not v.get("site"):
        return esc("(no stack recorded)")
    frames = v.get("frames") or []
    if not frames:
        return esc(v["site"])
    inner = "<br>".join(esc(f) for f in frames)
    return f"<details><summary>{esc(v['site'])}</summary><small>{inner}</small></details>"


stack_cell.left = True  # type: ignore[attr-defined]  # text: aligned left in tables


def _sited(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [dict(r, _stack={"site": r.get("top_frame"), "frames": r.get("frames")})
            for r in rows]


def tensors_html(page: Page, doc: dict[str, Any], s: dict[str, Any]) -> None:
    """Tensors alive by site (tensors report)."""
    d = doc.get("tensors") or {}
    head = (f"<p>alive: {num(d.get('total_count'))} tensors, "
            f"{human_bytes(d.get('total_bytes'))} from {num(d.get('stacks'))} stacks"
            + (f"; {num(d['pending_free_count'])} freed but pending on another stream "
               f"({human_bytes(d.get('pending_free_bytes'))})"
               if d.get("pending_free_count") else "") + "</p>")
    page.section("Tensors alive (PyTorch)", None, None, head + table(_sited(
        d.get("by_stack") or []), [
        ("bytes", "bytes", human_bytes), ("requested_bytes", "requested", human_bytes),
        ("count", "tensors", num), ("device", "device", num),
        ("_stack", "allocated at (click for the stack)", stack_cell)]))


def pool_html(page: Page, doc: dict[str, Any], s: dict[str, Any]) -> None:
    """Reserved versus active over time and the segment map, per device, with the
    per-pool and per-segment tables (allocator-pool report)."""
    d = doc.get("allocator_pool") or {}
    st = s.get("allocator_state") or {}
    for series in st.get("series") or []:
        fig = plots.allocator_state(series)
        page.section(f"PyTorch allocator over time, device {series['device']}", fig,
                     '<p class="note">the snapshot keeps no history: its state at the end '
                     "is below</p>",
                     f"<p>at the end: reserved {human_bytes(series['end_reserved_bytes'])}, "
                     f"active {human_bytes(series['end_active_bytes'])} (blocks held by "
                     "tensors or pending free, in their rounded sizes) from "
                     f"{num(series['entries'])} trace entries</p>")
    for m in st.get("maps") or []:
        labels = [f"{hexa(x['address'])} {x['pool']} ({human_bytes(x['total_bytes'])})"
                  for x in m["segments"]]
        more = (f'<p class="note">{num(m["left_out"])} smaller segments not drawn</p>'
                if m["left_out"] else "")
        when = "" if m.get("oom_t_s") is None else (
            f" at the out-of-memory at {num(m['oom_t_s'])} s (asked for "
            f"{human_bytes(m['requested_bytes'])}; blocks in their rounded sizes)")
        page.section(f"Segment map, device {m['device']}{when}", plots.segment_map(m, labels),
                     '<p class="note">no segments</p>', more)
    page.section("PyTorch allocator pool", None, None, (
        f"<p>reserved {human_bytes(d.get('reserved_bytes'))} in "
        f"{num(d.get('segment_count'))} segments, allocated "
        f"{human_bytes(d.get('allocated_bytes'))}; reserved but unallocated "
        f"{human_bytes(d.get('reserved_unallocated_bytes'))}, largest free block "
        f"{human_bytes(d.get('largest_inactive_bytes'))}</p>")
        + table(d.get("pools") or [], [
            ("device", "device", num), ("pool", "pool", text),
            ("segments", "segments", num), ("reserved_bytes", "reserved", human_bytes),
            ("allocated_bytes", "allocated", human_bytes),
            ("reserved_unallocated_bytes", "unallocated", human_bytes),
            ("largest_inactive_bytes", "largest free", human_bytes),
            ("fragmentation", "fragmentation", num)])
        + "<h3>Per segment (most unallocated first)</h3>"
        + table(d.get("segments") or [], [
            ("address", "address", hexa), ("device", "device", num), ("pool", "pool", text),
            ("reserved_bytes", "reserved", human_bytes),
            ("allocated_bytes", "allocated", human_bytes),
            ("reserved_unallocated_bytes", "unallocated", human_bytes),
            ("largest_inactive_bytes", "largest free", human_bytes)]))


def growth_html(page: Page, doc: dict[str, Any], s: dict[str, Any]) -> None:
    """What the allocator's history kept, by site (allocator-growth report)."""
    d = doc.get("allocator_growth") or {}
    rate = d.get("growth_bytes_per_s")
    head = ("<p>no trace entries in the snapshot</p>" if not d.get("entries") else
            f"<p>{num(d['entries'])} trace entries over {num(d.get('span_s'))} s: active "
            f"{human_bytes(d.get('start_active_bytes'))} -> "
            f"{human_bytes(d.get('end_active_bytes'))} (peak "
            f"{human_bytes(d.get('peak_active_bytes'))}"
            + (f", {human_bytes(rate)}/s" if rate is not None and rate > 0 else "")
            + f"); reserved {human_bytes(d.get('start_reserved_bytes'))} -> "
            f"{human_bytes(d.get('end_reserved_bytes'))}</p>")
    page.section("PyTorch allocator growth", None, None, head + table(_sited(
        d.get("by_stack") or []), [
        ("retained_bytes", "retained", human_bytes), ("retained_count", "kept", num),
        ("allocs", "allocs", num), ("retained_bytes_per_alloc", "per alloc", human_bytes),
        ("_stack", "allocated at (click for the stack)", stack_cell)]))
