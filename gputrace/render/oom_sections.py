"""Terminal section of the oom report. Formats; computes nothing.

Every string was made printable by the terminal renderer before it gets here, and
each is handed to rich as plain text, never markup.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

from gputrace.render import cells, term_table
from gputrace.render.holder_sections import no_live_owner

SAMPLE_WORDS = {"incident": "the sample taken for it", "tick": "the nearest periodic sample",
                "allocator": "the free memory CUDA reported to the allocator"}


HELD_NOTE = ("held: one figure per process, each piece once; layer api/rm/uvm: "
             "per-layer breakdown, never added")


def _ms(ns: Any) -> str:
    return "-" if ns is None else f"{int(ns) / 1e6:,.2f} ms"


def _gpu_line(inc: dict[str, Any]) -> str:
    g, hb = inc["gpu"], cells.human_bytes
    where = f"GPU {inc['gpu_index']}" if inc["gpu_index"] is not None else "GPU unknown"
    if g is None:
        return f"{where}: no free-memory sample"
    word = SAMPLE_WORDS.get(str(g["sample_trigger"]), "the nearest sample")
    d = g["sample_distance_ns"]
    when = ("at the failure" if g["sample_ts_ns"] is None
            else f"{_ms(abs(d))} {'after' if d >= 0 else 'before'} the failure")
    return (f"{where}: total {hb(g['total_bytes'])}, free {hb(g['free_bytes'])}, largest "
            f"free region {hb(g['largest_free_bytes'])} ({word}, {when})")


def _headline(inc: dict[str, Any]) -> str:
    who = f"pid {inc['pid']} ({cells.plain(inc['comm'])}) tid {cells.plain(inc['tid'])}"
    if where := cells.workload(inc):
        who += f" in {where}"
    out = (f"at {inc['t_s']:.3f} s: {who}: {inc['call']} ({inc['layer']}) of "
           f"{cells.human_bytes(inc['requested_bytes'])}")
    if inc["attempts"] > 1:
        span = (inc["last_ts_ns"] - inc["ts_ns"]) / 1e9
        out += f", {inc['attempts']} attempts in {span:.3f} s (one retry loop)"
    return out


def _holders(con: Console, inc: dict[str, Any], window_s: float, limit: int) -> None:
    t, hb, plain = term_table.table, cells.human_bytes, cells.plain
    rows = [{**h, "traced_text": "yes" if h["traced"] else "not traced"}
            for h in inc["holders"]]
    gpu = "unknown" if inc["gpu_index"] is None else inc["gpu_index"]
    t(con, f"Holders of GPU {gpu} (driver accounting beside the recorded memory)",
      rows, [("pid", "pid", plain), ("comm", "comm", plain), ("traced_text", "traced", str),
             ("driver_bytes", "driver", hb), ("held_bytes", "held", hb),
             ("grew_bytes", f"grew {window_s:g}s", hb), ("api_bytes", "layer api", hb),
             ("rm_bytes", "layer rm", hb), ("uvm_bytes", "layer uvm", hb),
             ("allocator_reserved_bytes", "pool rsv", hb),
             ("allocator_allocated_bytes", "pool used", hb)], limit)
    if rows:
        con.print(Text(f"  {HELD_NOTE}", style="dim"))
    if (rest := inc.get("holders_left_out")) and rest["count"]:
        con.print(Text(f"  ... {cells.num(rest['count'])} more holders not listed (driver "
                       f"{hb(rest['driver_bytes'])}, held {hb(rest['held_bytes'])}; "
                       "--format json lists the first ones)", style="dim"))
    sites = [{"pid": h["pid"], **s} for h in inc["holders"] for s in h["top_sites"]]
    cols: list[term_table.Col] = [
        ("pid", "pid", plain), ("layer", "layer", str), ("what", "what", plain),
        ("bytes", "bytes", hb), ("count", "count", cells.num), ("site", "stack", plain)]
    t(con, "Top live allocation sites", sites, cols, limit)
    grew = [{"pid": h["pid"], **s} for h in inc["holders"] for s in h["grew_sites"]]
    t(con, f"Grown in the {window_s:g} s before", grew, cols, limit)


def oom_section(con: Console, d: dict[str, Any], limit: int) -> None:
    """oom: one block per incident: what failed, the GPU then, the verdict, the holders."""
    if not d["count"]:
        con.print(Text("no allocation failed for want of memory"))
        return
    by = ", ".join(f"{v['incidents']} {v['verdict']}" for v in d["by_verdict"])
    con.print(Text(f"{d['count']} out-of-memory incident(s), {d['failures']} failed call(s): "
                   f"{by}", style="bold"))
    for n, inc in enumerate(d["incidents"][:limit], 1):
        con.print(Text(f"Incident {n} " + _headline(inc), style="bold"))
        con.print(Text(f"  verdict: {inc['verdict'].upper()}: {inc['evidence']}",
                       style="red" if inc["verdict"] != "unknown" else "yellow"))
        con.print(Text("  " + _gpu_line(inc)))
        if inc["allocator_pool_bytes"] is not None:
            con.print(Text("  caching allocators' reserved but unallocated: "
                           + cells.human_bytes(inc["allocator_pool_bytes"])))
        nested = inc["nested"]
        if nested:
            con.print(Text(f"  the same failure in the driver: {len(nested)} x "
                           + ", ".join(sorted({f"{x['call']} ({x['layer']})" for x in nested}))))
        con.print(Text("  stack: " + (inc["stack"] or "(none recorded)")))
        _holders(con, inc, d["window_s"], limit)
        no_live_owner(con, inc.get("no_live_owner"), limit)
    if len(d["incidents"]) > limit:
        con.print(Text(f"... {len(d['incidents']) - limit} more incidents (use --rows or "
                       "--format json)", style="dim"))
