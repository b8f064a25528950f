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

GPU faults, batches, migrations and evictions come from the `uvm_tools` layer
(the driver's tools events) or the `driver` layer (in-kernel driver hooks); a trace with only
`cpu_faults` reports them as null ("not recorded"), never 0.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from gputrace.analyses import migrations
from gputrace.analyses.cpu_faults import cpu_blocks, cpu_processes
from gputrace.analyses.growth import live_series
from gputrace.analyses.helpers.common import (
    BLOCK_2M,
    NS_PER_S,
    Inputs,
    quantiles,
    records,
    trace_warnings,
)
from gputrace.analyses.helpers.gpus import memory_sizes
from gputrace.analyses.helpers.lifetimes import api_lifetimes, uvm_lifetimes
from gputrace.analyses.report import Report, not_recorded

QUESTION = "How often does managed memory fault, and does it thrash or oversubscribe the GPU?"
TOP = 10


def windows(start_ns: int, end_ns: int, window_s: float) -> tuple[int, int, int]:
    """(window length ns, number of windows, length of the last window ns).

    Windows of `window_s` start at the trace start and the last one ends at the trace
    end. A remainder of at least half a window is a window of its own (shorter, its
    rate divided by its own length); a shorter remainder joins the window before it,
    so no window but a whole trace shorter than half a window is under half a window
    long, and a few faults at the very end cannot make a peak out of a sliver. Every
    event lies in the window that contains it, and every window lies inside the span,
    so the mean over the span (total / span) is a length-weighted average of the
    window rates and never exceeds the peak.
    """
    w = max(int(window_s * NS_PER_S), 1)
    span = max(end_ns - start_ns, 1)
    full, rem = divmod(span, w)
    if full == 0:
        return w, 1, span
    if rem == 0:
        return w, full, w
    if 2 * rem >= w:
        return w, full + 1, rem
    return w, full, w + rem


def _win(start_ns: int, w: int, k: int) -> pl.Expr:
    """The window holding each row (a short remainder belongs to the last window)."""
    return ((pl.col("ts_ns") - start_ns) // w).clip(0, k - 1)


def _win_len(w: int, k: int, last: int) -> pl.Expr:
    """Length in seconds of window `win`."""
    return pl.when(pl.col("win") == k - 1).then(last).otherwise(w) / NS_PER_S


def rates(faults: pl.LazyFrame, start_ns: int, end_ns: int, window_s: float) -> pl.LazyFrame:
    """Faults per (pid, GPU, source, access type): total, mean/s over the span, and the
    busiest window (see `windows` for the window rule)."""
    w, k, last = windows(start_ns, end_ns, window_s)
    span_s = max(end_ns - start_ns, 1) / NS_PER_S
    key = ["pid", "gpu_index", "source", "access_type"]
    per = (faults.with_columns(win=_win(start_ns, w, k))
           .group_by(*key, "win").agg(pl.len().alias("n"))
           .with_columns(len_s=_win_len(w, k, last))
           .with_columns(rate=pl.col("n") / pl.col("len_s")))
    def busiest(c: str) -> pl.Expr:
        # earliest of the busiest windows, so ties give the same answer every run
        return pl.col(c).sort_by(["rate", "win"], descending=[True, False]).first()

    return (per.group_by(key).agg(
        pl.col("n").sum().alias("faults"),
        pl.col("rate").max().alias("peak_per_s"),
        (busiest("win") * w / NS_PER_S).alias("peak_window_start_s"),
        busiest("len_s").alias("peak_window_len_s"))
        .with_columns(mean_per_s=pl.col("faults") / span_s)
        .sort("faults", *key, descending=[True, False, False, False, False], nulls_last=True))


def gpu_windows(faults: pl.LazyFrame, start_ns: int, end_ns: int,
                window_s: float) -> pl.LazyFrame:
    """GPU faults per window, GPU and process, busiest first (same windows as `rates`)."""
    w, k, last = windows(start_ns, end_ns, window_s)
    return (faults.filter(pl.col("gpu_index").is_not_null())
            .with_columns(win=_win(start_ns, w, k))
            .group_by("gpu_index", "pid", "win").agg(pl.len().alias("faults"))
            .with_columns(window_start_s=pl.col("win") * w / NS_PER_S,
                          window_len_s=_win_len(w, k, last))
            .with_columns(per_s=pl.col("faults") / pl.col("window_len_s"))
            .drop("win")
            .sort("per_s", "gpu_index", "pid", "window_start_s",
                  descending=[True, False, False, False], nulls_last=True))


def batches(fb: pl.LazyFrame) -> pl.LazyFrame:
    """Fault batches per GPU and process: count, size distribution, duplicate share,
    service time quantiles."""
    return (fb.group_by("gpu_index", "pid").agg(
        pl.len().alias("batches"), pl.col("faults").sum().cast(pl.Int64),
        pl.col("duplicates").sum().cast(pl.Int64).alias("duplicates"),
        pl.col("faults").min().alias("faults_min"),
        *quantiles("faults", "faults_"), *quantiles("duration_ns", "service_ns_"))
        .with_columns(duplicate_share=pl.when(pl.col("faults") > 0)
                      .then(pl.col("duplicates") / pl.col("faults")))
        .sort("gpu_index", "pid", nulls_last=True))


def thrashing(migrations: pl.LazyFrame, start_ns: int, end_ns: int, window_s: float,
              min_reversals: int) -> pl.LazyFrame:
    """Block-windows where >= min_reversals migrations return to the previous source
    (the same windows as `rates`)."""
    w, k, _ = windows(start_ns, end_ns, window_s)
    m = (migrations.with_columns(block_2m=pl.col("address") - pl.col("address") % BLOCK_2M)
         .sort("block_2m", "ts_ns")
         .with_columns(rev=(pl.col("dst") == pl.col("src").shift(1).over("block_2m"))
                       .fill_null(False),
                       win=_win(start_ns, w, k)))
    return (m.group_by("block_2m", "win").agg(
        pl.col("pid").drop_nulls().first(), pl.len().alias("migrations"),
        pl.col("rev").sum().alias("reversals"),
        pl.concat_list("src", "dst").explode().unique().sort().cast(pl.String).str.join(",")
        .alias("processors"))
        .filter(pl.col("reversals") >= min_reversals)
        .with_columns(window_start_s=pl.col("win") * w / NS_PER_S).drop("win")
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


def oversubscription(inp: Inputs, resident_df: pl.DataFrame | None) -> dict[str, Any] | None:
    """Managed memory against GPU memory: the managed address space (syscall or API
    layer) against all GPUs, and the bytes estimated resident on each GPU
    (`migrations.resident`) against that GPU's memory (`gpus.memory_sizes`: the
    manifest's size, else the RM heap size sampled; `memory_source` says which)."""
    peak = managed_peak(inp)
    sizes = memory_sizes(inp)
    total_mem = sum(b for b, _ in sizes.values())
    per_gpu = []
    for r in resident_df.iter_rows(named=True) if resident_df is not None else ():
        mem, src = sizes.get(r["gpu_index"], (None, None))
        ratio = round(r["resident_peak_bytes"] / mem, 6) if mem else None
        at = r.pop("peak_ts_ns")
        peak_s = round((at - inp.start_ns) / NS_PER_S, 6) if r["resident_peak_bytes"] else None
        per_gpu.append({**r, "peak_s": peak_s, "gpu_memory_bytes": mem,
                        "memory_source": src, "ratio": ratio})
    if peak is None and resident_df is None:
        return None
    out: dict[str, Any] = {"managed_peak_bytes": None, "gpu_memory_bytes": total_mem or None,
                           "gpu_memory_source": sorted({s for _, s in sizes.values()}) or None,
                           "gpus_of_unknown_memory": _unknown_gpus(inp, sizes),
                           "ratio": None, "oversubscribed": None, "source": None}
    if peak is not None:
        ratio = peak[0] / total_mem if total_mem else None
        out.update(managed_peak_bytes=peak[0], ratio=ratio,
                   oversubscribed=bool(ratio and ratio > 1.0), source=peak[1])
    out["resident_by_gpu"] = per_gpu if resident_df is not None else None
    return out


def _unknown_gpus(inp: Inputs, sizes: dict[int, tuple[int, str]]) -> list[int]:
    """Manifest GPUs whose memory neither the manifest nor an RM sample gives: the
    ratio against all GPUs' memory is then too high."""
    return [g for g in range(len(inp.gpu_memory_bytes)) if g not in sizes]


def fault_rate(inp: Inputs, *, window_s: float = 1.0, min_reversals: int = 3,
               top: int | None = None) -> Report:
    """The fault-rate report (see the module doc)."""
    warnings = trace_warnings(inp)
    gpu = inp.has("driver") or inp.has("uvm_tools")
    tools = inp.has("uvm_tools")
    if not gpu and not inp.has("cpu_faults"):
        return not_recorded("fault-rate", QUESTION, ["cpu_faults", "driver", "uvm_tools"],
                            warnings)
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
        migrations.event_counts(ev), migrations.driver_thrashing(ev, inp.start_ns),
        migrations.throttling(ev, inp.start_ns, inp.end_ns),
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
    missing = [x for x in ("driver", "uvm_tools") if not inp.has(x)] if not gpu else []
    return Report("fault-rate", QUESTION, True, data, missing, warnings)
