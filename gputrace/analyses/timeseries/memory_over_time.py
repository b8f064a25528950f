"""How much memory was in use over time, per (layer, process) and per GPU?

Live bytes as step series with the leak report's growth fit drawn over flagged
ones, and bytes in use per GPU; downsampled by `downsample.decimate`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from gputrace.analyses.helpers import partition
from gputrace.analyses.helpers.common import NS_PER_MIN, chunk_bytes
from gputrace.analyses.helpers.inputs import Inputs
from gputrace.analyses.helpers.lifetimes import lifetimes, memory
from gputrace.analyses.leaks.growth import BINS, live_series, theil_sen
from gputrace.analyses.timeseries.downsample import (
    BUCKETS,
    MAX_SERIES,
    decimate,
    seconds_since_start,
    series_list,
)


def _fit_lines(inp: Inputs, series: pl.DataFrame, flagged: set[tuple[str, int]]
               ) -> list[tuple[int, dict[str, Any]]]:
    """The growth fit of each flagged (layer, pid), as two end points: the Theil-Sen line
    through the same 32 per-bin troughs the leak report's growth test fits; each with
    the series' first time (ns), which orders them."""
    lines = []
    for (layer, pid), g in series.group_by(["layer", "pid"], maintain_order=True):
        if (layer, pid) not in flagged:
            continue
        ts = g["ts_ns"].to_numpy()
        live = g["live_bytes"].to_numpy()
        t0, t1 = int(ts.min()), int(ts.max())
        if t1 <= t0:
            continue
        b = (ts - t0) * BINS // (t1 - t0 + 1)
        x, y, carried = [], [], 0.0
        for k in range(BINS):
            hit = live[b == k]
            if hit.size:
                x.append(k * (t1 - t0) / NS_PER_MIN / BINS)
                y.append(min(float(hit.min()), carried))
                carried = float(hit[-1])
        if len(x) < 3:
            continue
        slope, icpt, _, _ = theil_sen(np.array(x), np.array(y))
        dur = (t1 - t0) / NS_PER_MIN
        lines.append((int(ts[0]), {"layer": layer, "pid": pid, "slope_bytes_per_min": slope,
                                   "t_s": seconds_since_start(inp, pl.Series([t0, t1])),
                                   "values": [icpt, icpt + slope * dur]}))
    return lines


def live_bytes(inp: Inputs, buckets: int = BUCKETS,
               flagged: set[tuple[str, int]] | None = None,
               max_series: int | None = MAX_SERIES) -> dict[str, Any]:
    """Live bytes per (layer, pid) over time, with growth fit lines for `flagged` series."""
    if not (inp.has("api") or inp.has("syscall")):
        return {"recorded": False, "series": [], "omitted": 0, "fits": []}
    # one pid slice at a time (every series is one process's): each slice's lifetimes
    # are collected once and feed its series, names and fits; only the decimated
    # points and the fit lines (a few per series) outlive the slice
    parts, names, fits = [], {}, []
    for part in partition.pid_slices(inp, partition.slice_count(inp)):
        lt = memory(lifetimes(part)).collect()
        full = live_series(lt.lazy()).collect()
        for r in lt.group_by("layer", "pid").agg(
                pl.col("comm").drop_nulls().first()).iter_rows(named=True):
            names[(r["layer"], r["pid"])] = f"{r['layer']} {r['comm'] or '?'} ({r['pid']})"
        del lt
        parts.append(decimate(full.lazy(), ["layer", "pid"], "live_bytes", inp, buckets))
        fits += _fit_lines(inp, full, flagged or set())
        del full
    out = series_list(inp, pl.concat(parts), ["layer", "pid"], "live_bytes", names,
                      max_series)
    # in the order the whole trace's series first appear (as computed in one piece)
    out["fits"] = [f for _, f in sorted(fits, key=lambda tf: (tf[0], tf[1]["layer"],
                                                                 tf[1]["pid"]))]
    return out


def _rm_deltas(inp: Inputs) -> pl.LazyFrame:
    """(gpu_index, ts_ns, delta) of the RM allocations of `inp` that name their GPU."""
    lt = memory(lifetimes(inp)).filter((pl.col("layer") == "rm")
                                       & pl.col("gpu_index").is_not_null())
    return pl.concat([
        lt.select("gpu_index", pl.col("alloc_ts_ns").alias("ts_ns"),
                  pl.col("size_bytes").alias("delta")),
        lt.filter(pl.col("free_ts_ns").is_not_null()).select(
            "gpu_index", pl.col("free_ts_ns").alias("ts_ns"),
            (-pl.col("size_bytes")).alias("delta"))])


def gpu_bytes(inp: Inputs, buckets: int = BUCKETS) -> dict[str, Any]:
    """Bytes in use per GPU over time: PMM chunks when the driver layer has them, else
    RM allocations that name their GPU."""
    src = "pmm chunks"
    ev: pl.LazyFrame | None = None
    if inp.has("driver"):
        size = chunk_bytes()
        delta = (pl.when(pl.col("chunk_op") == "alloc").then(size)
                 .when(pl.col("chunk_op").is_in(["free", "evict"])).then(-size).otherwise(0))
        ev = inp.scan("chunks").select("gpu_index", "ts_ns", delta.alias("delta"))
        if ev.select(pl.len()).collect().item() == 0:
            ev = None
    if ev is None and inp.has("syscall"):
        src = "rm allocations"
        ev = pl.concat([_rm_deltas(part).collect() for part in
                        partition.pid_slices(inp, partition.slice_count(inp))]).lazy()
    if ev is None:
        return {"recorded": False, "source": None, "series": [], "omitted": 0}
    steps = (ev.with_columns(pl.col("gpu_index").cast(pl.Int64), pl.col("delta").cast(pl.Int64))
             .sort(pl.col("ts_ns") * 2 + (pl.col("delta") > 0).cast(pl.Int64))
             .with_columns(used_bytes=pl.col("delta").cum_sum().over("gpu_index")))
    df = decimate(steps, ["gpu_index"], "used_bytes", inp, buckets)
    out = series_list(inp, df, ["gpu_index"], "used_bytes", {})
    for s in out["series"]:
        s["name"] = f"GPU {s['gpu_index']}"
    out["source"] = src
    return out
