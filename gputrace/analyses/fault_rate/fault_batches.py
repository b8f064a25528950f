"""How large are the GPU's fault batches, how many faults are duplicates, and how
long does the driver take to service a batch? Part of the fault-rate report.
"""

from __future__ import annotations

import polars as pl

from gputrace.analyses.helpers.common import quantiles


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
