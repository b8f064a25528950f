"""How much of an address space is free at a given time, and in how usable pieces?

Used intervals (space, start, end, alloc_ts_ns, free_ts_ns) are replayed; at
the time asked for, in [lo, hi) of each space:

- free_bytes, largest_free_run_bytes (longest address range with nothing used);
- unusable_2m_bytes: free bytes inside 2 MiB root chunks that are partly
  used, which no 2 MiB allocation can use;
- partial_root_share: partly used root chunks / root chunks in use;
- fragmentation_index = 1 - largest free run / free bytes (0 = one run).
"""

from __future__ import annotations

import polars as pl

from gputrace.analyses.helpers.common import BLOCK_2M


def snapshot(iv: pl.LazyFrame, spaces: pl.DataFrame, at: pl.DataFrame) -> pl.LazyFrame:
    """Free-space measures per space at time `at[space]` (spaces: space, lo, hi)."""
    live = (iv.join(at.lazy(), on="space")
            .filter((pl.col("alloc_ts_ns") <= pl.col("t"))
                    & (pl.col("free_ts_ns").is_null() | (pl.col("free_ts_ns") > pl.col("t"))))
            .join(spaces.lazy(), on="space").sort("space", "start")
            .with_columns(run=pl.col("end").cum_max().over("space")))
    gaps = live.with_columns(gap=pl.col("start") - pl.col("run").shift(1).over("space")
                             .fill_null(pl.col("lo")))
    per = gaps.group_by("space").agg(
        pl.col("gap").max().alias("gap"), pl.col("run").max().alias("last"),
        (pl.col("end") - pl.col("start")).sum().alias("used_bytes"))
    roots = (live.with_columns(r=pl.int_ranges((pl.col("start") - pl.col("lo")) // BLOCK_2M,
                                               (pl.col("end") - pl.col("lo") - 1) // BLOCK_2M + 1))
             .explode("r").with_columns(
                 u=pl.min_horizontal("end", pl.col("lo") + (pl.col("r") + 1) * BLOCK_2M)
                 - pl.max_horizontal("start", pl.col("lo") + pl.col("r") * BLOCK_2M))
             .group_by("space", "r").agg(pl.col("u").sum())
             .group_by("space").agg(pl.len().alias("roots_used"),
                                    (pl.col("u") < BLOCK_2M).sum().alias("roots_partial")))
    s = (spaces.lazy().join(at.lazy(), on="space").join(per, on="space", how="left")
         .join(roots, on="space", how="left")
         .with_columns(pl.col("used_bytes", "roots_used", "roots_partial").fill_null(0)))
    free = pl.col("hi") - pl.col("lo") - pl.col("used_bytes")
    largest = pl.max_horizontal(pl.col("gap").fill_null(0),
                                pl.col("hi") - pl.col("last").fill_null(pl.col("lo")))
    usable = ((pl.col("hi") - pl.col("lo")) // BLOCK_2M - pl.col("roots_used")) * BLOCK_2M
    return s.select(
        "space", pl.col("t").alias("ts_ns"), "used_bytes", free.alias("free_bytes"),
        largest.alias("largest_free_run_bytes"),
        pl.max_horizontal(free - usable, 0).alias("unusable_2m_bytes"),
        pl.when(pl.col("roots_used") > 0).then(pl.col("roots_partial") / pl.col("roots_used"))
        .alias("partial_root_share"),
        pl.when(free > 0).then(1 - largest / free).alias("fragmentation_index")).sort("space")


def peak_times(iv: pl.LazyFrame) -> pl.LazyFrame:
    ev = pl.concat([
        iv.select("space", pl.col("alloc_ts_ns").alias("t"), (pl.col("end") - pl.col("start"))
                  .alias("d")),
        iv.filter(pl.col("free_ts_ns").is_not_null()).select(
            "space", pl.col("free_ts_ns").alias("t"),
            (pl.col("start") - pl.col("end")).alias("d"))])
    return (ev.group_by("space", "t").agg(pl.col("d").sum()).sort("space", "t")
            .with_columns(used=pl.col("d").cum_sum().over("space"))
            .group_by("space").agg(pl.col("t").sort_by("used", descending=True).first()))
