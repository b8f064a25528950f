"""Terminal sections of the fault-rate and fragmentation reports. Formats; computes nothing.

The shared helpers (table, number and byte formats) are the terminal renderer's.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

from gputrace.render import cells, term_table


def _share(v: Any) -> str:
    return "-" if v is None else f"{100 * float(v):.1f}%"


def fault_rate_section(con: Console, d: dict[str, Any], limit: int) -> None:
    """fault-rate: rates, batches, CPU faults, migrations, thrashing, evictions, memory."""
    t, num, plain, hb, us, hexa = (term_table.table, cells.num, cells.plain,
                                   cells.human_bytes, cells.us, cells.hexa)
    w = d.get("windows") or {}
    title = f"Fault rate ({d['window_s']} s windows"
    if w.get("count") == 1:
        title += f"; trace shorter: one window of {num(w.get('last_window_s'))} s"
    elif w.get("last_window_s") is not None and w["last_window_s"] != d["window_s"]:
        title += f"; the last one {num(w['last_window_s'])} s"
    t(con, title + ")", d["rates"], [
        ("pid", "pid", plain), ("gpu_index", "gpu", num), ("source", "source", str),
        ("access_type", "access", str), ("faults", "faults", num),
        ("mean_per_s", "mean/s", num), ("peak_per_s", "peak/s", num),
        ("peak_window_start_s", "peak at s", num)], limit)
    if d.get("gpu_windows"):
        t(con, "Busiest GPU fault windows", d["gpu_windows"], [
            ("gpu_index", "gpu", num), ("pid", "pid", plain),
            ("window_start_s", "window s", num), ("faults", "faults", num),
            ("per_s", "per s", num)], min(limit, 5))
    if d["batches"] is not None:
        t(con, "GPU fault batches", d["batches"], [
            ("gpu_index", "gpu", num), ("pid", "pid", plain), ("batches", "batches", num),
            ("faults", "faults", num), ("duplicate_share", "dup share", num),
            ("faults_min", "size min", num), ("faults_p50", "p50", num),
            ("faults_max", "max", num), ("service_ns_p50", "svc p50 µs", us),
            ("service_ns_p99", "svc p99 µs", us)], limit)
    cpu = d["cpu_faults"]
    con.print(Text(f"CPU faults on managed memory: {num(cpu['total'])} "
                   f"(reads {num(cpu['reads'])}, writes {num(cpu['writes'])}) "
                   f"in {num(cpu['blocks'])} blocks of 2 MiB"))
    t(con, "CPU faults per process", cpu.get("by_process", []), [
        ("pid", "pid", plain), ("comm", "comm", plain), ("faults", "faults", num),
        ("reads", "reads", num), ("writes", "writes", num), ("blocks", "blocks", num),
        ("per_s", "per s", num)], limit)
    t(con, "Top CPU-faulting 2 MiB blocks", cpu["top_blocks"], [
        ("pid", "pid", plain), ("block_2m", "block", hexa), ("faults", "faults", num),
        ("reads", "reads", num), ("writes", "writes", num)], limit)
    m = d.get("migrations")
    if m is not None:
        con.print(Text(f"migrations: {num(m['migrations'])} ({hb(m['bytes'])})"))
        t(con, "Migrations by cause, direction and size", m["by_cause_direction_size"], [
            ("cause", "cause", str), ("direction", "direction", str),
            ("size_class", "size", str), ("migrations", "count", num),
            ("bytes", "bytes", hb)], limit)
    th = d["thrashing"]
    if th is not None:
        t(con, f"Thrashing blocks (>= {th['min_reversals']} reversals in "
          f"{th['window_s']} s)", th["blocks"], [
              ("block_2m", "block", hexa), ("pid", "pid", plain),
              ("window_start_s", "window s", num), ("migrations", "migr", num),
              ("reversals", "reversals", num), ("processors", "procs", str)], limit)
    ev = d.get("driver_events")
    if ev is not None:
        t(con, "Thrashing reported by the driver", ev["thrashing_regions"], [
            ("pid", "pid", plain), ("address", "region", hexa),
            ("size_bytes", "size", hb), ("events", "events", num),
            ("processors", "procs", str), ("first_s", "first s", num)], limit)
        thr = ev["throttling"]
        con.print(Text(f"throttling: {num(thr['regions'])} regions, "
                       f"{us(thr['total_ns'])} µs in all"))
        t(con, "Driver events by kind", ev["by_kind"], [
            ("kind", "kind", str), ("reason", "reason", plain), ("events", "events", num),
            ("processes", "procs", num)], limit)
    evi = d["evictions"]
    if evi is not None:
        con.print(Text(f"evictions: {num(evi['migrations'])} migrations "
                       f"({hb(evi['bytes'])}), {num(evi['chunk_evictions'])} chunk evictions"))
    else:
        con.print(Text("GPU faults, batches, migrations, thrashing, evictions: not recorded "
                       "(they need the UVM tools events or in-kernel driver hooks)",
                       style="dim"))
    o = d["oversubscription"]
    if o is not None and o.get("managed_peak_bytes") is not None:
        if not o["gpu_memory_bytes"]:
            con.print(Text(f"managed memory peak {hb(o['managed_peak_bytes'])} (GPU memory "
                           "unknown: neither the manifest nor an RM sample gives its size)"))
        else:
            src = " and ".join(o.get("gpu_memory_source") or [])
            con.print(Text(f"managed memory peak {hb(o['managed_peak_bytes'])} vs GPU memory "
                           f"{hb(o['gpu_memory_bytes'])} (from the {src}): ratio "
                           f"{num(o['ratio'])}"))
            if o.get("gpus_of_unknown_memory"):
                con.print(Text("GPU memory unknown for GPU(s) "
                               + ", ".join(str(g) for g in o["gpus_of_unknown_memory"])
                               + ": the ratio is too high", style="yellow"))
            if o["oversubscribed"]:
                con.print(Text("OVERSUBSCRIBED", style="bold red"))
    if o is not None and o.get("resident_by_gpu"):
        t(con, "Managed bytes resident on each GPU (estimate: blocks first touched by the "
          "GPU + migrations in - out)", o["resident_by_gpu"], [
            ("gpu_index", "gpu", num), ("resident_peak_bytes", "peak", hb),
            ("resident_end_bytes", "end", hb), ("populated_bytes", "first touch", hb),
            ("gpu_memory_bytes", "memory", hb),
            ("ratio", "ratio", num), ("memory_source", "memory from", plain)], limit)


def fragmentation_section(con: Console, d: dict[str, Any], limit: int) -> None:
    """fragmentation: RM samples per GPU, then PMM chunks where recorded."""
    t, num, hb = term_table.table, cells.num, cells.human_bytes
    rm = d.get("rm")
    if rm is not None:
        rows = [{"gpu_index": g["gpu_index"], "at": at, **g[at]} for g in rm["gpus"]
                for at in ("worst", "max", "end") if g.get(at)]
        t(con, "GPU memory from RM (unusable = share of free memory one allocation "
          "cannot use; per size: at most; worst = the sample with the most unusable, "
          "max = each column's highest over all samples)", rows, [
              ("gpu_index", "gpu", num), ("at", "at", str), ("t_s", "t s", num),
              ("heap_free_bytes", "free", hb), ("largest_free_bytes", "largest", hb),
              ("unusable_share", "unusable", _share),
              ("unusable_share_2m", "2 MiB", _share),
              ("unusable_share_64m", "64 MiB", _share),
              ("unusable_share_1g", "1 GiB", _share)], limit)
        series = [{"gpu_index": g["gpu_index"], **s} for g in rm["gpus"] for s in g["series"]]
        t(con, "GPU memory over time", series, [
            ("gpu_index", "gpu", num), ("t_s", "t s", num), ("heap_free_bytes", "free", hb),
            ("largest_free_bytes", "largest", hb), ("unusable_share", "unusable", _share)],
          limit)
    gpus = d.get("gpus")
    if gpus is None:
        con.print(Text("PMM chunks: not recorded (chunk events need in-kernel driver hooks, "
                       "layer `driver`, which this trace lacks; the UVM tools events and RM "
                       "samples carry none)", style="dim"))
        return
    rows = [{"gpu_index": g["gpu_index"], "at": at, **g[at]} for g in gpus
            for at in ("peak", "end") if g.get(at)]
    t(con, "Fragmentation per GPU (PMM chunks)", rows, [
        ("gpu_index", "gpu", num), ("at", "at", str), ("used_bytes", "used", hb),
        ("free_bytes", "free", hb), ("largest_free_run_bytes", "largest run", hb),
        ("unusable_2m_bytes", "unusable 2M", hb),
        ("partial_root_share", "partial roots", num),
        ("fragmentation_index", "index", num)], limit)
    hist = [{"gpu_index": g["gpu_index"], **g["histogram"]} for g in gpus]
    t(con, "Chunk allocations by size", hist, [
        ("gpu_index", "gpu", num), ("4KiB", "4 KiB", num), ("64KiB", "64 KiB", num),
        ("2MiB", "2 MiB", num), ("other", "other", num)], limit)
