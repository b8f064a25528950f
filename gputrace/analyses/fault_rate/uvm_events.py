"""What did the UVM driver's own heuristics report (uvm_events): thrashing it
detected, throttling regions (start paired with end), remote mappings and fatal
faults? Part of the fault-rate report (`driver_events`).
"""

from __future__ import annotations

import polars as pl

from gputrace.analyses.helpers.common import NS_PER_S


def event_counts(events: pl.LazyFrame) -> pl.LazyFrame:
    """uvm_events per kind and reason."""
    return (events.group_by("kind", "reason").agg(pl.len().alias("events"),
                                                  pl.col("pid").n_unique().alias("processes"))
            .sort("kind", "reason", nulls_last=True))


def driver_thrashing(events: pl.LazyFrame, start_ns: int) -> pl.LazyFrame:
    """Regions the driver itself reported as thrashing, per process and region."""
    return (events.filter(pl.col("kind") == "thrashing")
            .group_by("pid", "address", "size_bytes").agg(
                pl.len().alias("events"), pl.col("processors").drop_nulls().first(),
                ((pl.col("ts_ns").min() - start_ns) / NS_PER_S).alias("first_s"),
                ((pl.col("ts_ns").max() - start_ns) / NS_PER_S).alias("last_s"))
            .sort("events", "pid", "address", descending=[True, False, False]))


def throttling(events: pl.LazyFrame, start_ns: int, end_ns: int) -> pl.LazyFrame:
    """Throttling regions: each start paired with the next end of the same process,
    processor and page (an end never seen closes at the trace end)."""
    th = (events.filter(pl.col("kind").is_in(["throttling_start", "throttling_end"]))
          .with_columns(is_end=pl.col("kind") == "throttling_end")
          .sort("pid", "processor", "address", "ts_ns", "is_end"))
    key = ["pid", "processor", "address"]
    same = pl.lit(True)
    for k in key:
        same = same & (pl.col(k) == pl.col(k).shift(-1)).fill_null(False)
    nxt_end = pl.col("is_end").shift(-1).fill_null(False) & same
    return (th.with_columns(end_ts=pl.when(nxt_end).then(pl.col("ts_ns").shift(-1)))
            .filter(~pl.col("is_end"))
            .select(*key, ((pl.col("ts_ns") - start_ns) / NS_PER_S).alias("start_s"),
                    (pl.col("end_ts").fill_null(end_ns) - pl.col("ts_ns")).alias("duration_ns"),
                    pl.col("end_ts").is_null().alias("open_at_end"))
            .sort("duration_ns", "pid", "address", "start_s",
                  descending=[True, False, False, False]))
