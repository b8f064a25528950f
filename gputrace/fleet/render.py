"""The fleet document as text for a terminal (computes nothing; host text escaped)."""

from __future__ import annotations

from typing import Any, TextIO

from gputrace.render.safe import printable
from gputrace.units import format_bytes


def _num(x: float | None, fmt: str = "{:.3f}") -> str:
    return "-" if x is None else fmt.format(x)


def _table(out: TextIO, head: list[str], rows: list[list[Any]]) -> None:
    cells = [head, *[[printable("-" if c is None else c) for c in r] for r in rows]]
    widths = [min(40, max(len(str(r[i])) for r in cells)) for i in range(len(head))]
    for r in cells:
        out.write("  " + "  ".join(str(c)[:40].ljust(w) for c, w in zip(r, widths, strict=True))
                  .rstrip() + "\n")
    if not rows:
        out.write("  (none)\n")


def render_fleet_terminal(doc: dict[str, Any], out: TextIO) -> None:
    """Write the fleet report: headline, then one section per fleet question."""
    lk = doc["leaks"]
    where = f" where {printable(doc['where'])}" if doc["where"] else ""
    out.write(f"Fleet {printable(doc['dataset'])}{where}: {doc['traces']} traces, "
              f"{doc['engine']['workers']} workers ({doc['engine']['scheduler']})\n")
    out.write(f"Leaked: {format_bytes(lk['total_bytes'])} in {lk['total_count']} allocations\n")
    for w in doc["warnings"]:
        out.write(f"warning: {printable(w)}\n")
    out.write("\nTop leaking jobs\n")
    _table(out, ["host", "pid", "comm", "bytes", "count", "cmdline"],
           [[j["host"], j["pid"], j["comm"], format_bytes(j["bytes"]), j["count"], j["cmdline"]]
            for j in lk["top_jobs"]])
    out.write("\nTop leaking call sites\n")
    _table(out, ["bytes", "count", "hosts", "traces", "what", "frames"],
           [[format_bytes(s["bytes"]), s["count"], s["host_count"], s["traces"], s["what"],
             s["frames"]] for s in lk["top_sites"]])
    hd = doc["holders"]
    out.write(f"\nTop holders (held when the process exited or the trace ended, each byte "
              f"once; {format_bytes(hd['held_bytes'])} in all; per layer: a breakdown)\n")
    _table(out, ["host", "pid", "comm", "held", "program", "pool", "context", "driver-only",
                 "api layer", "rm layer", "uvm layer"],
           [[h["host"], h["pid"], h["comm"], *(format_bytes(h.get(k)) for k in (
               "held_bytes", "program_bytes", "allocator_pool_bytes", "cuda_context_bytes",
               "driver_only_bytes", "api_layer_bytes", "rm_layer_bytes", "uvm_layer_bytes"))]
            for h in hd["top_processes"]])
    g = doc["gpus"]
    out.write("\nGPUs by fragmentation (PMM index, worst of peak/end)\n")
    _table(out, ["host", "gpu", "model", "index", "memory"],
           [[r["host"], r["gpu_index"], r["gpu_model"], _num(r["fragmentation_index"]),
             format_bytes(r["memory_bytes"])] for r in g["by_fragmentation"]])
    out.write("\nGPUs by oversubscription (managed memory peak / the host's GPU memory)\n")
    _table(out, ["host", "trace", "model", "ratio", "managed peak", "GPU memory"],
           [[r["host"], r["trace_id"][:12], r["gpu_model"], _num(r["oversubscription_ratio"]),
             format_bytes(r["managed_peak_bytes"]), format_bytes(r["gpu_memory_bytes"])]
            for r in g["by_oversubscription"]])
    out.write("\nFault rate per driver version (faults/s per trace)\n")
    _table(out, ["driver", "traces", "median", "MAD", "max", "outliers"],
           [[d["driver_version"], d["traces"], _num(d["median_faults_per_s"]),
             _num(d["mad_faults_per_s"]), _num(d["max_faults_per_s"]),
             ", ".join(f"{o['host']}:{o['trace_id'][:12]}" for o in d["outliers"]) or "-"]
            for d in doc["fault_rate"]["by_driver_version"]])
    out.write("\nDrops per host\n")
    _table(out, ["host", "traces", "with drops", "dropped"],
           [[h["host"], h["traces"], h["traces_with_drops"], h["dropped"]]
            for h in doc["drops"]["by_host"]])
    out.write("\nFlagged traces\n")
    _table(out, ["host", "date", "trace", "why"],
           [[f["host"], f["date"], f["trace_id"], "; ".join(f["reasons"])]
            for f in doc["flagged"]])
    if doc["report_totals"]:
        out.write("\nReport totals (over the traces that recorded each report)\n")
        _table(out, ["report", "traces", "figure", "total"],
               [[key, t["traces"], f, v] for key, t in doc["report_totals"].items()
                for f, v in t.items() if f != "traces"])
    out.write("\nReports not aggregated across traces\n")
    _table(out, ["report", "why"], [[r["report"], r["why"]] for r in doc["not_aggregated"]])
