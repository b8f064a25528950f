"""How much GPU memory is free, and how much of it can one allocation still use (RM samples)?

From `gpu_memory` (RM's FB_GET_INFO_V2 answers: heap size, heap free, largest
free region), per sample:

- unusable_share = 1 - largest free / free: the share of free memory that no
  single allocation can use (0 = one free region; 0.735 = with 80 GiB free,
  only 21 GiB can be had in one piece). Exact.
- unusable_share_<X> for X = 2 MiB, 64 MiB, 1 GiB: the share of free memory
  that cannot serve allocations of X, at most: (free - floor(largest / X) * X)
  / free. It is exactly 1.0 when the largest region is smaller than X; when it
  is not, RM does not say how the rest of the free memory is split, so the
  value is an upper bound (every other region smaller than X).

Samples whose query failed (status != 0) carry no sizes and are counted.
"""

from __future__ import annotations

import polars as pl

from gputrace.analyses.helpers.common import NS_PER_S

MiB = 1 << 20
ALLOC_SIZES = {"2m": 2 * MiB, "64m": 64 * MiB, "1g": 1024 * MiB}
SERIES_MAX = 200
"""Samples per GPU kept as they are in the report; longer series are bucketed."""


def samples(gm: pl.LazyFrame, start_ns: int) -> pl.LazyFrame:
    """Successful samples with the unusable shares (see the module doc)."""
    free = pl.col("heap_free_bytes").cast(pl.Int64)
    largest = pl.col("largest_free_bytes").cast(pl.Int64)
    shares = [
        pl.when(free > 0).then((free - (largest // size) * size) / free)
        .alias(f"unusable_share_{name}")
        for name, size in ALLOC_SIZES.items()
    ]
    return (gm.filter(pl.col("status") == 0)
            .select("gpu_index", "ts_ns",
                    ((pl.col("ts_ns") - start_ns) / NS_PER_S).alias("t_s"),
                    pl.col("heap_size_bytes").cast(pl.Int64),
                    free.alias("heap_free_bytes"), largest.alias("largest_free_bytes"),
                    pl.col("largest_free_base_bytes").cast(pl.Int64),
                    pl.when(free > 0).then(1 - largest / free).alias("unusable_share"),
                    *shares)
            .sort("gpu_index", "ts_ns"))


def failed(gm: pl.LazyFrame) -> pl.LazyFrame:
    """Failed queries per GPU and RM status."""
    return (gm.filter(pl.col("status") != 0).group_by("gpu_index", "status")
            .agg(pl.len().alias("samples")).sort("gpu_index", "status"))


def series(s: pl.DataFrame, end_ns: int, start_ns: int) -> pl.DataFrame:
    """At most SERIES_MAX rows per GPU: long series become equal time buckets holding the
    least free memory, smallest largest region and worst shares of their samples."""
    counts = s.group_by("gpu_index").len()
    if counts.height == 0 or int(counts["len"].max() or 0) <= SERIES_MAX:  # type: ignore[arg-type]
        return s.drop("ts_ns")
    width = max((end_ns - start_ns) // SERIES_MAX, 1)
    worst = [c for c in s.columns if c.startswith("unusable_share")]
    return (s.with_columns(b=(pl.col("ts_ns") - start_ns) // width)
            .group_by("gpu_index", "b").agg(
                pl.col("t_s").min(), pl.col("heap_size_bytes").max(),
                pl.col("heap_free_bytes").min(), pl.col("largest_free_bytes").min(),
                pl.col("largest_free_base_bytes").last(), *[pl.col(c).max() for c in worst])
            .sort("gpu_index", "b").drop("b").select(s.drop("ts_ns").columns))
