"""How often does managed memory fault, and does it thrash or oversubscribe the GPU?

- rates: fault rows per window (default 1 s) per process, GPU, source and
  access type; mean over the trace and the peak window.
- batches: GPU replayable fault batches per GPU: size distribution,
  duplicate share (duplicates / faults fetched) and service time.
- cpu_faults: CPU faults on managed memory per process and per 2 MiB block,
  reads vs writes, the blocks faulted most (layer `cpu_faults` or `driver`).
- thrashing: a 2 MiB block thrashes in a window when at least N of its
  migrations go back to the processor the previous one came from.
- evictions: migrations caused by eviction, and PMM chunk evictions.
- oversubscription: peak live managed bytes (managed mmaps, else
  cuMemAllocManaged) against the GPUs' total memory from the manifest.

GPU faults, batches, migrations and evictions need the `driver` layer; a
trace with only `cpu_faults` reports them as null ("not recorded"), never 0.
"""

from __future__ import annotations

import polars as pl

from gputrace.analyses.common import (
    BLOCK_2M,
    NS_PER_S,
    Inputs,
    quantiles,
    records,
    trace_warnings,
)
from gputrace.analyses.cpu_faults import cpu_blocks, cpu_processes
from gputrace.analyses.growth import live_series
from gputrace.analyses.lifetimes import api_lifetimes, uvm_lifetimes
from gputrace.analyses.report import Report, not_recorded

QUESTION = "How often does managed memory fault, and does it thrash or oversubscribe the GPU?"
TOP = 10


def rates(faults: pl.LazyFrame, start_ns: int, end_ns: int, window_s: float) -> pl.LazyFrame:
    w = int(window_s * NS_PER_S)
    dur_s = max(end_ns - start_ns, 1) / NS_PER_S
    key = ["pid", "gpu_index", "source", "access_type"]
    per = (faults.with_columns(win=(pl.col("ts_ns") - start_ns) // w)
           .group_by(*key, "win").agg(pl.len().alias("n")))
    return (per.group_by(key).agg(
        pl.col("n").sum().alias("faults"),
        (pl.col("n").max() / window_s).alias("peak_per_s"),
        # earliest of the busiest windows, so ties give the same answer every run
        (pl.col("win").sort_by(["n", "win"], descending=[True, False]).first() * window_s)
        .alias("peak_window_start_s"))
        .with_columns(mean_per_s=pl.col("faults") / dur_s)
        .sort("faults", *key, descending=[True, False, False, False, False], nulls_last=True))


def batches(fb: pl.LazyFrame) -> pl.LazyFrame:
    return (fb.group_by("gpu_index").agg(
        pl.len().alias("batches"), pl.col("faults").sum().cast(pl.Int64),
        pl.col("duplicates").sum().cast(pl.Int64).alias("duplicates"),
        *quantiles("faults", "faults_"), *quantiles("duration_ns", "service_ns_"))
        .with_columns(duplicate_share=pl.when(pl.col("faults") > 0)
                      .then(pl.col("duplicates") / pl.col("faults")))
        .sort("gpu_index"))


def thrashing(migrations: pl.LazyFrame, start_ns: int, window_s: float,
              min_reversals: int) -> pl.LazyFrame:
    """Block-windows where >= min_reversals migrations return to the previous source."""
    w = int(window_s * NS_PER_S)
    m = (migrations.with_columns(block_2m=pl.col("address") - pl.col("address") % BLOCK_2M)
         .sort("block_2m", "ts_ns")
         .with_columns(rev=(pl.col("dst") == pl.col("src").shift(1).over("block_2m"))
                       .fill_null(False),
                       win=(pl.col("ts_ns") - start_ns) // w))
    return (m.group_by("block_2m", "win").agg(
        pl.col("pid").drop_nulls().first(), pl.len().alias("migrations"),
        pl.col("rev").sum().alias("reversals"),
        pl.concat_list("src", "dst").explode().unique().sort().cast(pl.String).str.join(",")
        .alias("processors"))
        .filter(pl.col("reversals") >= min_reversals)
        .with_columns(window_start_s=pl.col("win") * window_s).drop("win")
        .sort("reversals", "block_2m", "window_start_s", descending=[True, False, False]))


def managed_peak(inp: Inputs) -> tuple[int, str] | None:
    """Peak live managed bytes across processes, and where it was read from."""
    if inp.has("syscall"):
        lt = uvm_lifetimes(inp.scan("ioctls"), inp.scan("mappings")).filter(
            pl.col("what") == "managed mmap")
        source = "managed mmaps"
    elif inp.has("api"):
        lt = api_lifetimes(inp.scan("cuda_calls")).filter(pl.col("what") == "cuMemAllocManaged")
        source = "cuMemAllocManaged"
    else:
        return None
    s = live_series(lt.with_columns(pid=pl.lit(0, pl.Int32),
                                    size_bytes=pl.col("size_bytes").cast(pl.Int64))).collect()
    return (int(s["live_bytes"].max() or 0), source) if s.height else None  # type: ignore[arg-type]


def fault_rate(inp: Inputs, *, window_s: float = 1.0, min_reversals: int = 3,
               top: int | None = None) -> Report:
    warnings = trace_warnings(inp)
    gpu = inp.has("driver")
    if not gpu and not inp.has("cpu_faults"):
        return not_recorded("fault-rate", QUESTION, ["cpu_faults", "driver"], warnings)
    if not gpu:
        warnings.append("fault-rate: driver layer not recorded: GPU faults, fault batches, "
                        "migrations, thrashing and evictions are unknown (null), not zero")
    if inp.untracked_managed:
        warnings.append(f"fault-rate: {inp.untracked_managed} managed blocks or ranges were "
                        "too many for the in-kernel filter; their CPU faults are missing")
    n = TOP if top is None else top
    f, mig = inp.scan("faults"), inp.scan("migrations")
    evict = mig.filter(pl.col("cause") == "eviction")
    r, b, cpu, procs, th, ev, ev_gpu, ch = pl.collect_all([
        rates(f, inp.start_ns, inp.end_ns, window_s), batches(inp.scan("fault_batches")),
        cpu_blocks(f), cpu_processes(f, inp.start_ns, inp.end_ns),
        thrashing(mig, inp.start_ns, window_s, min_reversals),
        evict.select(pl.len().alias("n"), pl.col("size_bytes").sum().alias("bytes")),
        evict.group_by(pl.col("src").alias("processor")).agg(
            pl.len().alias("migrations"), pl.col("size_bytes").sum().alias("bytes"))
        .sort("processor"),
        inp.scan("chunks").filter(pl.col("chunk_op") == "evict").select(pl.len())])
    peak = managed_peak(inp)
    total_mem = sum(inp.gpu_memory_bytes)
    over = None
    if peak is not None:
        ratio = peak[0] / total_mem if total_mem else None
        over = {"managed_peak_bytes": peak[0], "gpu_memory_bytes": total_mem or None,
                "ratio": ratio, "oversubscribed": bool(ratio and ratio > 1.0),
                "source": peak[1]}
    data = {
        "window_s": window_s,
        "rates": records(r),
        "batches": records(b) if gpu else None,
        "cpu_faults": {"total": int(cpu["faults"].sum()), "reads": int(cpu["reads"].sum()),
                       "writes": int(cpu["writes"].sum()), "blocks": cpu.height,
                       "by_process": records(procs), "top_blocks": records(cpu.head(n))},
        "thrashing": {"window_s": window_s, "min_reversals": min_reversals,
                      "blocks": records(th if top is None else th.head(top))} if gpu else None,
        "evictions": {"migrations": int(ev["n"][0]), "bytes": int(ev["bytes"][0] or 0),
                      "chunk_evictions": int(ch.item()), "by_processor": records(ev_gpu)}
        if gpu else None,
        "oversubscription": over,
    }
    return Report("fault-rate", QUESTION, True, data, [] if gpu else ["driver"], warnings)
