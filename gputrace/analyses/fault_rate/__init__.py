"""How often does managed memory fault, and does it thrash or oversubscribe the GPU?

- rates: fault rows per window (default 1 s) per process, GPU, source and
  access type; mean over the trace span and the busiest window. Each event lies
  in the window containing it and windows lie inside the span (`windows`), so
  the mean never exceeds the peak on a trace of any length. gpu_windows: GPU
  faults per window, GPU and process.
- batches: GPU fault batches per GPU and process: size distribution,
  duplicate share (duplicates / faults) and service time (first fault to replay).
- cpu_faults: CPU faults on managed memory per process and per 2 MiB block,
  reads vs writes, the blocks faulted most.
- migrations: by cause, direction and size class (<=4KiB / <=64KiB / <=2MiB / >2MiB:
  bounds on the size, not the page size the driver used).
- thrashing: a 2 MiB block thrashes in a window when at least N of its
  migrations go back to the processor the previous one came from; plus the
  regions the driver itself reported thrashing and its throttling regions.
- evictions: migrations caused by eviction, and PMM chunk evictions.
- oversubscription: peak live managed bytes (managed mmaps, else
  cuMemAllocManaged) against all GPUs' memory, and managed bytes estimated
  resident on each GPU (first-touch GPU faults + migrations) against its memory
  (the manifest's size, else the RM heap size sampled).

Each part answers its own question in its own module: fault_windows (rates,
gpu_windows), fault_batches, cpu_faults, migrations (migrations, evictions),
driver_events, thrashing, oversubscription; this module assembles the report.

GPU faults, batches, migrations and evictions come from the `uvm_tools` layer
(the driver's tools events) or the `driver` layer (in-kernel driver hooks); a trace with only
`cpu_faults` reports them as null ("not recorded"), never 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import polars as pl

from gputrace.analyses import fail_on
from gputrace.analyses.fault_rate import migrations
from gputrace.analyses.fault_rate import uvm_events as driver_events
from gputrace.analyses.fault_rate.cpu_faults import cpu_blocks, cpu_processes
from gputrace.analyses.fault_rate.fault_batches import batches
from gputrace.analyses.fault_rate.fault_windows import gpu_windows, rates, windows
from gputrace.analyses.fault_rate.oversubscription import oversubscription
from gputrace.analyses.fault_rate.thrashing import thrashing
from gputrace.analyses.helpers.common import NS_PER_S, records
from gputrace.analyses.helpers.identity import by_identity
from gputrace.analyses.helpers.inputs import Inputs, trace_warnings
from gputrace.analyses.registry import unrecorded
from gputrace.analyses.report import Report
from gputrace.analyses.report_spec import DiffTable, FleetUse, Gate, ReportSpec

if TYPE_CHECKING:
    from gputrace.analyses.registry import Context


def _run(ctx: Context) -> Report:
    o = ctx.opts
    return fault_rate(ctx.inp, window_s=o.window_s, min_reversals=o.thrash_min, top=o.top,
                      by=o.by)


SPEC = ReportSpec(
    "fault-rate", "fault_rate", "Fault rate",
    "How often does managed memory fault, and does it thrash or oversubscribe the GPU?",
    ("cpu_faults", "driver", "uvm_tools"), _run,
    gates=(Gate("thrashing", fail_on.thrashing_hit, blind=fail_on.thrashing_blind),),
    terminal="gputrace.render.fault_fragmentation_sections:fault_rate_section",
    html=("gputrace.render.html_sections:fault_rate",),
    diff=(DiffTable("fault_rates", "Fault rates", ("rates",),
                    ("source", "access_type", "gpu_index"),
                    ("faults", "mean_per_s", "peak_per_s")),),
    fleet=FleetUse(answers=("gpus", "fault_rate")), place=20)
QUESTION = SPEC.question


TOP = 10


def fault_rate(inp: Inputs, *, window_s: float = 1.0, min_reversals: int = 3,
               top: int | None = None, by: str | None = None) -> Report:
    """The fault-rate report (see the module doc); `by`: CPU faults per process also
    added up per "pod" or "container"."""
    warnings = trace_warnings(inp)
    gpu = inp.has("driver") or inp.has("uvm_tools")
    tools = inp.has("uvm_tools")
    if (absent := unrecorded(SPEC, inp, warnings)) is not None:
        return absent
    if not gpu:
        warnings.append("fault-rate: driver layers (driver, uvm_tools) not recorded: "
                        "neither in-kernel driver hooks (driver) nor the driver's UVM tools "
                        "events (uvm_tools) were traced, so GPU faults, fault batches, "
                        "migrations, thrashing and evictions are unknown (null), not zero")
    if inp.untracked_managed:
        warnings.append(f"fault-rate: {inp.untracked_managed} managed blocks or ranges were "
                        "too many for the in-kernel filter; their CPU faults are missing")
    n = TOP if top is None else top
    f, mig, ev = inp.scan("faults"), inp.scan("migrations"), inp.scan("uvm_events")
    evict = mig.filter(pl.col("cause") == "eviction")
    (r, win, b, cpu, procs, th, evs, ev_gpu, ch, cause, direction, res, kinds, dth,
     thr, cnt) = pl.collect_all([
        rates(f, inp.start_ns, inp.end_ns, window_s),
        gpu_windows(f, inp.start_ns, inp.end_ns, window_s),
        batches(inp.scan("fault_batches")),
        cpu_blocks(f), cpu_processes(f, inp.start_ns, inp.end_ns),
        thrashing(mig, inp.start_ns, inp.end_ns, window_s, min_reversals),
        evict.select(pl.len().alias("n"), pl.col("size_bytes").sum().alias("bytes")),
        evict.group_by(pl.col("src").alias("processor")).agg(
            pl.len().alias("migrations"), pl.col("size_bytes").sum().alias("bytes"))
        .sort("processor"),
        inp.scan("chunks").filter(pl.col("chunk_op") == "evict").select(pl.len()),
        migrations.by_cause(mig), migrations.by_direction(mig), migrations.resident(mig, f),
        driver_events.event_counts(ev), driver_events.driver_thrashing(ev, inp.start_ns),
        driver_events.throttling(ev, inp.start_ns, inp.end_ns),
        inp.scan("uvm_counters").group_by("pid", "counter").agg(pl.col("value").max())
        .sort("pid", "counter")])
    _, k, last = windows(inp.start_ns, inp.end_ns, window_s)

    def cut(df: pl.DataFrame) -> list[dict[str, Any]]:
        return records(df if top is None else df.head(top))

    tot = mig.select(pl.len().alias("n"), pl.col("size_bytes").cast(pl.Int64).sum()
                     .alias("b")).collect()
    data = {
        "window_s": window_s,
        "windows": {"count": k, "last_window_s": last / NS_PER_S,
                    "span_s": max(inp.end_ns - inp.start_ns, 1) / NS_PER_S},
        "rates": records(r),
        "gpu_windows": cut(win) if gpu else None,
        "batches": records(b) if gpu else None,
        "cpu_faults": {"total": int(cpu["faults"].sum()), "reads": int(cpu["reads"].sum()),
                       "writes": int(cpu["writes"].sum()), "blocks": cpu.height,
                       "by_process": records(procs), "top_blocks": records(cpu.head(n))},
        "migrations": {"migrations": int(tot["n"][0]), "bytes": int(tot["b"][0] or 0),
                       "by_cause_direction": records(direction),
                       "by_cause_direction_size": records(cause)} if gpu else None,
        "thrashing": {"window_s": window_s, "min_reversals": min_reversals,
                      "blocks": cut(th)} if gpu else None,
        "driver_events": {"by_kind": records(kinds), "thrashing_regions": cut(dth),
                          "throttling": {"regions": thr.height,
                                         "total_ns": int(thr["duration_ns"].sum() or 0),
                                         "longest": cut(thr)}} if tools else None,
        "evictions": {"migrations": int(evs["n"][0]), "bytes": int(evs["bytes"][0] or 0),
                      "chunk_evictions": int(ch.item()), "by_processor": records(ev_gpu)}
        if gpu else None,
        "oversubscription": oversubscription(inp, res if gpu else None),
        "uvm_counters": records(cnt) if tools else None,
    }
    if by is not None:
        data[f"by_{by}"] = records(by_identity(
            procs.lazy(), inp.scan("processes"), by,
            ["faults", "reads", "writes", "per_s"]).collect())
    # without a GPU layer the rest of its layers (cpu_faults is there) are missing
    missing = [x for x in SPEC.layers if not inp.has(x)] if not gpu else []
    return Report("fault-rate", QUESTION, True, data, missing, warnings)
