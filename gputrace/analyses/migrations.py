"""Where does managed memory move, why, in what sizes, and how much of it sits on each GPU?

- `by_cause`: migrations grouped by cause, direction (source -> destination
  processor, trace GPU indices with -1 = CPU) and size class (the page size a
  migration fits in: 4 KiB, 64 KiB, 2 MiB, or larger).
- `resident`: managed bytes resident on each GPU over time, estimated from
  migrations (bytes in minus bytes out, from the trace start), against the
  GPU's memory: what oversubscription looks like from the driver's side.
- `driver_events`: the UVM driver's own heuristics (uvm_events): thrashing it
  detected, throttling regions (start paired with end), remote mappings and
  fatal faults.
"""

from __future__ import annotations

import polars as pl

from gputrace.analyses.common import NS_PER_S

KiB = 1024
SIZE_CLASSES = ("4KiB", "64KiB", "2MiB", ">2MiB")


def size_class(col: str = "size_bytes") -> pl.Expr:
    """The page size a migration fits in: 4KiB, 64KiB, 2MiB (UVM's page sizes) or >2MiB."""
    s = pl.col(col).cast(pl.Int64)
    return (pl.when(s <= 4 * KiB).then(pl.lit("4KiB"))
            .when(s <= 64 * KiB).then(pl.lit("64KiB"))
            .when(s <= 2048 * KiB).then(pl.lit("2MiB"))
            .otherwise(pl.lit(">2MiB")))


def processor_name(col: str) -> pl.Expr:
    """'cpu' for -1, else 'gpu<N>'."""
    return (pl.when(pl.col(col) < 0).then(pl.lit("cpu"))
            .otherwise(pl.lit("gpu") + pl.col(col).cast(pl.String)))


def by_cause(migrations: pl.LazyFrame) -> pl.LazyFrame:
    """Migrations and bytes per cause, direction and size class."""
    return (migrations.with_columns(size_class=size_class())
            .group_by("cause", "src", "dst", "size_class").agg(
                pl.len().alias("migrations"),
                pl.col("size_bytes").cast(pl.Int64).sum().alias("bytes"))
            .with_columns(direction=processor_name("src") + pl.lit("->")
                          + processor_name("dst"))
            .sort("bytes", "cause", "src", "dst", "size_class",
                  descending=[True, False, False, False, False]))


def by_direction(migrations: pl.LazyFrame) -> pl.LazyFrame:
    """Migrations and bytes per cause and direction (all sizes)."""
    return (migrations.group_by("cause", "src", "dst").agg(
        pl.len().alias("migrations"), pl.col("size_bytes").cast(pl.Int64).sum().alias("bytes"))
        .with_columns(direction=processor_name("src") + pl.lit("->") + processor_name("dst"))
        .sort("bytes", "cause", "src", "dst", descending=[True, False, False, False]))


def resident(migrations: pl.LazyFrame) -> pl.LazyFrame:
    """Peak and end of managed bytes migrated onto each GPU and not migrated off again.

    Counted from the trace start, so memory already resident when recording began
    is not included (the estimate can be below the truth, never above it by
    more than what was resident before)."""
    moves = pl.concat([
        migrations.filter(pl.col("dst") >= 0).select(
            pl.col("dst").alias("gpu_index"), "ts_ns", pl.col("size_bytes").cast(pl.Int64)
            .alias("d")),
        migrations.filter(pl.col("src") >= 0).select(
            pl.col("src").alias("gpu_index"), "ts_ns", -pl.col("size_bytes").cast(pl.Int64)
            .alias("d")),
    ])
    return (moves.sort("gpu_index", "ts_ns")
            .with_columns(r=pl.col("d").cum_sum().over("gpu_index"))
            .group_by("gpu_index").agg(
                pl.col("r").max().clip(lower_bound=0).alias("resident_peak_bytes"),
                pl.col("r").last().clip(lower_bound=0).alias("resident_end_bytes"),
                pl.col("ts_ns").sort_by("r", descending=True).first().alias("peak_ts_ns"))
            .sort("gpu_index"))


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
