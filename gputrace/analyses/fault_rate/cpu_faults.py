"""Where do processes fault on managed memory from the CPU, reading or writing?

Rows of `faults` with source `cpu` (layer `cpu_faults`, or the driver layer),
grouped per process and per 2 MiB VA block, with the read/write split.
"""

from __future__ import annotations

import polars as pl

from gputrace.analyses.helpers.common import NS_PER_S


def cpu_blocks(faults: pl.LazyFrame) -> pl.LazyFrame:
    return (faults.filter(pl.col("source") == "cpu").group_by("pid", "block_2m").agg(
        pl.len().alias("faults"), (pl.col("access_type") == "read").sum().alias("reads"),
        (pl.col("access_type") == "write").sum().alias("writes"))
        .sort("faults", "pid", "block_2m", descending=[True, False, False]))


def cpu_processes(faults: pl.LazyFrame, start_ns: int, end_ns: int) -> pl.LazyFrame:
    """CPU faults on managed memory per process: count, reads, writes, blocks, rate."""
    dur_s = max(end_ns - start_ns, 1) / NS_PER_S
    return (faults.filter(pl.col("source") == "cpu").group_by("pid").agg(
        pl.col("comm").drop_nulls().first(), pl.len().alias("faults"),
        (pl.col("access_type") == "read").sum().alias("reads"),
        (pl.col("access_type") == "write").sum().alias("writes"),
        pl.col("block_2m").n_unique().alias("blocks"))
        .with_columns(per_s=pl.col("faults") / dur_s)
        .sort("faults", "pid", descending=[True, False]))
