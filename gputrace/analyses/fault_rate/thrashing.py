"""Which 2 MiB blocks thrash: migrate back to where they came from at least N
times in one window? Part of the fault-rate report (same windows as its rates).
"""

from __future__ import annotations

import polars as pl

from gputrace.analyses.fault_rate.fault_windows import window_of, windows
from gputrace.analyses.helpers.common import BLOCK_2M, NS_PER_S


def thrashing(migrations: pl.LazyFrame, start_ns: int, end_ns: int, window_s: float,
              min_reversals: int) -> pl.LazyFrame:
    """Block-windows where >= min_reversals migrations return to the previous source
    (the same windows as `rates`)."""
    w, k, _ = windows(start_ns, end_ns, window_s)
    m = (migrations.with_columns(block_2m=pl.col("address") - pl.col("address") % BLOCK_2M)
         .sort("block_2m", "ts_ns")
         .with_columns(rev=(pl.col("dst") == pl.col("src").shift(1).over("block_2m"))
                       .fill_null(False),
                       win=window_of(start_ns, w, k)))
    return (m.group_by("block_2m", "win").agg(
        pl.col("pid").drop_nulls().first(), pl.len().alias("migrations"),
        pl.col("rev").sum().alias("reversals"),
        pl.concat_list("src", "dst").explode().unique().sort().cast(pl.String).str.join(",")
        .alias("processors"))
        .filter(pl.col("reversals") >= min_reversals)
        .with_columns(window_start_s=pl.col("win") * w / NS_PER_S).drop("win")
        .sort("reversals", "block_2m", "window_start_s", descending=[True, False, False]))
