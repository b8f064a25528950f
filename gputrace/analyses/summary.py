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

import polars as pl

from gputrace.analyses.common import Inputs, chunk_bytes, records, trace_warnings
from gputrace.analyses.growth import live_series
from gputrace.analyses.leaks import with_exits
from gputrace.analyses.lifetimes import lifetimes
from gputrace.analyses.report import Report, not_recorded
from gputrace.analyses.rm_objects import VIRTUAL_LAYER

QUESTION = "Which driver calls cost what, and who holds how much GPU memory, on which GPU?"
FULL_SHARE = 0.95


def ioctl_stats(ioctls: pl.LazyFrame) -> pl.LazyFrame:
    """Per (device, gpu_index, name): calls, failures, latency total and quantiles (ns).

    Exact nearest-rank quantiles (as `Expr.quantile(q, "nearest")`: rank
    round((n - 1) q), half away from zero) from a histogram of (group, latency)
    counts: the q-quantile is the least latency whose running count exceeds the
    rank. Latencies repeat, so the histogram is far smaller than the calls and
    nothing holds every call's latency per group."""
    keys = ["device", "gpu_index", "name"]
    failed = (pl.col("status").fill_null(0) != 0) | (pl.col("ret").fill_null(0) < 0)
    lat = pl.col("latency_ns")
    stats = ioctls.group_by(keys).agg(
        pl.len().alias("count"), failed.sum().alias("failed"), lat.sum().alias("total_ns"),
        lat.mean().alias("mean_ns"))
    hist = (ioctls.filter(lat.is_not_null()).group_by(*keys, "latency_ns")
            .agg(pl.len().alias("_c")).sort("latency_ns")
            .with_columns(_cum=pl.col("_c").cum_sum().over(keys),
                          _n=pl.col("_c").sum().over(keys)))

    def q(p: float, name: str) -> pl.Expr:
        rank = ((pl.col("_n") - 1).cast(pl.Float64) * p).round(0, "half_away_from_zero")
        return lat.filter(pl.col("_cum") > rank).min().cast(pl.Float64).alias(name)

    qs = hist.group_by(keys).agg(q(0.5, "latency_ns_p50"), q(0.9, "latency_ns_p90"),
                                 q(0.99, "latency_ns_p99"), lat.max().alias("latency_ns_max"))
    return (stats.join(qs, on=keys, how="left", nulls_equal=True)
            .sort("total_ns", "device", "name", descending=[True, False, False],
                  nulls_last=True))


def process_memory(lt: pl.LazyFrame, processes: pl.LazyFrame) -> pl.LazyFrame:
    """Per (layer, pid, comm): peak live bytes and bytes live at trace end."""
    peak = live_series(lt).group_by("layer", "pid").agg(
        pl.col("live_bytes").max().alias("peak_bytes"))
    live = (with_exits(lt, processes, "alloc_ts_ns")
            .with_columns(comm=pl.coalesce("pcomm", "comm"),
                          live=pl.col("free_ts_ns").is_null() & pl.col("exit_ts_ns").is_null())
            .group_by("layer", "pid")
            .agg(pl.col("comm").drop_nulls().first(), pl.len().alias("allocations"),
                 pl.col("size_bytes").filter("live").sum().alias("live_end_bytes")))
    return live.join(peak, on=["layer", "pid"]).sort("layer", "peak_bytes", "pid",
                                                    descending=[False, True, False])


def gpu_memory(chunks: pl.LazyFrame) -> pl.LazyFrame:
    """Per GPU: peak and final allocated bytes replayed from PMM chunk events."""
    size = chunk_bytes()
    delta = (pl.when(pl.col("chunk_op") == "alloc").then(size)
             .when(pl.col("chunk_op").is_in(["free", "evict"])).then(-size).otherwise(0))
    return (chunks.sort("gpu_index", "ts_ns")
            .with_columns(used=delta.cum_sum().over("gpu_index"))
            .group_by("gpu_index").agg(pl.col("used").max().alias("peak_bytes"),
                                       pl.col("used").last().alias("end_bytes"))
            .sort("gpu_index"))


def gpu_table(inp: Inputs, df: pl.DataFrame, source: str) -> dict[str, object]:
    """Per-GPU rows with capacity and share, plus imbalance (max / mean)."""
    cap = dict(enumerate(inp.gpu_memory_bytes))
    idx = {int(g) for g in df["gpu_index"]} | set(cap)
    rows = []
    for g in sorted(idx):
        hit = df.filter(pl.col("gpu_index") == g)
        peak = int(hit["peak_bytes"][0]) if hit.height else 0
        end = int(hit["end_bytes"][0]) if hit.height else 0
        total = cap.get(g) or None
        rows.append({"gpu_index": g, "peak_bytes": peak, "end_bytes": end,
                     "memory_bytes": total,
                     "peak_share": round(peak / total, 6) if total else None,
                     "full": bool(total and peak >= FULL_SHARE * total)})

    def imbalance(col: str) -> float | None:
        vals = [float(r[col]) for r in rows]  # type: ignore[arg-type]
        mean = sum(vals) / len(vals) if vals else 0.0
        return round(max(vals) / mean, 6) if mean > 0 else None

    return {"source": source, "gpus": rows, "imbalance_peak": imbalance("peak_bytes"),
            "imbalance_end": imbalance("end_bytes")}


def summary(inp: Inputs, lt: pl.LazyFrame | None = None) -> Report:
    """The summary report (pass `lt` to reuse lifetimes computed for leaks)."""
    warnings = trace_warnings(inp)
    if not (inp.has("syscall") or inp.has("api") or inp.has("driver")):
        return not_recorded("summary", QUESTION, ["api", "driver", "syscall"], warnings)
    lt = (lifetimes(inp) if lt is None else lt).filter(pl.col("layer") != VIRTUAL_LAYER)
    rm_gpu = (lt.filter((pl.col("layer") == "rm") & pl.col("gpu_index").is_not_null())
              .select("gpu_index", pl.col("alloc_ts_ns").alias("ts_ns"), "size_bytes",
                      "free_ts_ns"))
    rm_gpu_series = pl.concat([
        rm_gpu.select("gpu_index", "ts_ns", pl.col("size_bytes").alias("d")),
        rm_gpu.filter(pl.col("free_ts_ns").is_not_null()).select(
            "gpu_index", pl.col("free_ts_ns").alias("ts_ns"), (-pl.col("size_bytes")).alias("d"))
    ]).sort("gpu_index", "ts_ns").with_columns(used=pl.col("d").cum_sum().over("gpu_index")
    ).group_by("gpu_index").agg(pl.col("used").max().alias("peak_bytes"),
                                pl.col("used").last().alias("end_bytes"))
    io, procs, chunk_gpus, rm_gpus = pl.collect_all([
        ioctl_stats(inp.scan("ioctls")), process_memory(lt, inp.scan("processes")),
        gpu_memory(inp.scan("chunks")), rm_gpu_series])
    if inp.has("driver") and chunk_gpus.height:
        gpus: dict[str, object] | None = gpu_table(inp, chunk_gpus, "pmm chunks")
    elif rm_gpus.height:
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
