"""Which driver calls cost what, and who holds how much memory where?

- ioctls: count, failures and latency quantiles per device kind, GPU and
  command, like `nsys stats`' API summaries (exact quantiles, nearest rank).
- processes: peak and live (at trace end, process still running) bytes per
  layer and process, replayed from allocation lifetimes.
- GPUs: peak and final allocated bytes per GPU from PMM chunk events (driver
  layer; alloc adds 2^log2_size, free and evict subtract), or from RM
  allocations whose GPU is known; imbalance = max / mean of allocated bytes.
"""

from __future__ import annotations

import functools

import polars as pl

from gputrace.analyses.allocation_rows import with_exits
from gputrace.analyses.growth import live_series
from gputrace.analyses.helpers.common import records
from gputrace.analyses.helpers.gpus import gpu_table, pmm_gpus, replay_steps
from gputrace.analyses.helpers.inputs import Inputs, trace_warnings
from gputrace.analyses.helpers.lifetimes import VIRTUAL_LAYERS
from gputrace.analyses.helpers.partition import Slice, per_slice
from gputrace.analyses.helpers.scans import few_row_groups_ahead
from gputrace.analyses.report import Report, not_recorded

QUESTION = "Which driver calls cost what, and who holds how much GPU memory, on which GPU?"


def ioctl_stats(ioctls: pl.LazyFrame) -> pl.LazyFrame:
    """Per (device, gpu_index, name): calls, failures, latency total and quantiles (ns).

    Exact nearest-rank quantiles (as `Expr.quantile(q, "nearest")`: rank
    round((n - 1) q), half away from zero) from a histogram of (group, latency)
    counts: the q-quantile is the least latency whose running count exceeds the
    rank. Latencies repeat, so the histogram is far smaller than the calls and
    nothing holds every call's latency per group. Calls, failures and the total
    come from the same histogram: one pass over the table, read with few row
    groups decoded ahead (`few_row_groups_ahead`), then one group_by of the histogram."""
    keys = ["device", "gpu_index", "name"]
    # gpu_index names the /dev/nvidiaN file; on nvidiactl rows it can hold the GPU a
    # device object was allocated for, which is no reason to split a command's row.
    ioctls = ioctls.with_columns(
        gpu_index=pl.when(pl.col("device") == "gpu").then("gpu_index"))
    failed = (pl.col("status").fill_null(0) != 0) | (pl.col("ret").fill_null(0) < 0)
    lat = pl.col("latency_ns")
    # Collected apart (the scan setting holds while it runs). Null latencies form their
    # own bin: they count as calls, never as latencies.
    with few_row_groups_ahead():
        hist = (ioctls.group_by(*keys, "latency_ns")
                .agg(pl.len().alias("_c"), failed.sum().alias("_f")).collect())
    # Within a group rows keep the histogram's order: by latency, null bins last, so the
    # running count at a timed bin counts timed calls only.
    c, timed = pl.col("_c"), lat.is_not_null()
    n = c.filter(timed).sum()
    total = (lat * c).sum()

    def q(p: float, name: str) -> pl.Expr:
        rank = ((n - 1).cast(pl.Float64) * p).round(0, "half_away_from_zero")
        return lat.filter(timed & (c.cum_sum() > rank)).min().cast(pl.Float64).alias(name)

    # total / timed calls is lat.mean(): the total is exact (an integer far below 2**53)
    return (hist.lazy().sort("latency_ns", nulls_last=True).group_by(keys).agg(
        c.sum().alias("count"), pl.col("_f").sum().alias("failed"), total.alias("total_ns"),
        pl.when(n > 0).then(total / n).alias("mean_ns"),
        q(0.5, "latency_ns_p50"), q(0.9, "latency_ns_p90"), q(0.99, "latency_ns_p99"),
        lat.max().alias("latency_ns_max"))
        .sort("total_ns", "device", "name", descending=[True, False, False], nulls_last=True))


def process_memory(lt: pl.LazyFrame, processes: pl.LazyFrame) -> pl.LazyFrame:
    """Per (layer, pid, comm): peak live bytes and bytes live at trace end (unsorted)."""
    peak = live_series(lt).group_by("layer", "pid").agg(
        pl.col("live_bytes").max().alias("peak_bytes"))
    live = (with_exits(lt, processes, "alloc_ts_ns")
            .with_columns(comm=pl.coalesce("pcomm", "comm"),
                          live=pl.col("free_ts_ns").is_null() & pl.col("exit_ts_ns").is_null())
            .group_by("layer", "pid")
            .agg(pl.col("comm").drop_nulls().first(), pl.len().alias("allocations"),
                 pl.col("size_bytes").filter("live").sum().alias("live_end_bytes")))
    return live.join(peak, on=["layer", "pid"])


def summary_part(sl: Slice, rm_gpu: bool) -> dict[str, pl.DataFrame]:
    """What one pid slice adds: its processes' memory and, when `rm_gpu`, the
    (gpu_index, ts_ns, d) steps of its RM allocations with a known GPU."""
    inp = sl.inp
    lt = sl.lifetimes.filter(~pl.col("layer").is_in(list(VIRTUAL_LAYERS)))
    rm = (lt.filter((pl.col("layer") == "rm") & pl.col("gpu_index").is_not_null()
                    & pl.lit(rm_gpu))
          .select("gpu_index", pl.col("alloc_ts_ns").alias("ts_ns"), "size_bytes",
                  "free_ts_ns"))
    steps = pl.concat([
        rm.select("gpu_index", "ts_ns", pl.col("size_bytes").alias("d")),
        rm.filter(pl.col("free_ts_ns").is_not_null()).select(
            "gpu_index", pl.col("free_ts_ns").alias("ts_ns"), (-pl.col("size_bytes")).alias("d"))
    ])
    procs, steps_df = pl.collect_all([process_memory(lt, inp.scan("processes")), steps])
    return {"processes": procs, "rm_gpu": steps_df}


def summary(inp: Inputs, parts: list[dict[str, pl.DataFrame]] | None = None,
            pmm: pl.DataFrame | None = None) -> Report:
    """The summary report, from the `summary_part` of each pid slice (computed when not
    given; `pmm` must then be `pmm_gpus(inp)` and the parts' `rm_gpu` follow it)."""
    warnings = trace_warnings(inp)
    if not (inp.has("syscall") or inp.has("api") or inp.has("driver")):
        return not_recorded("summary", QUESTION, ["api", "driver", "syscall"], warnings)
    if parts is None:
        pmm = pmm_gpus(inp)
        step = functools.partial(summary_part, rm_gpu=pmm is None)
        parts = per_slice(inp, {"summary": step})["summary"]
    io = ioctl_stats(inp.scan("ioctls")).collect()
    procs = pl.concat([p["processes"] for p in parts]).sort(
        "layer", "peak_bytes", "pid", descending=[False, True, False])
    if pmm is not None:
        gpus: dict[str, object] | None = gpu_table(inp, pmm, "pmm chunks")
    elif (rm_gpus := replay_steps(pl.concat([p["rm_gpu"] for p in parts]))).height:
        gpus = gpu_table(inp, rm_gpus, "rm allocations")
    else:
        gpus = None
        warnings.append("summary: per-GPU memory needs PMM chunk events (driver layer) or "
                        "RM allocations with a known GPU; none in this trace")
    missing = [x for x in ("syscall", "api", "driver") if not inp.has(x)]
    data = {
        "ioctls": records(io) if inp.has("syscall") else None,
        "processes": records(procs),
        "gpus": gpus,
    }
    return Report("summary", QUESTION, True, data, missing, warnings)
