"""Where does managed memory move, why, in what sizes, and how much of it sits on each GPU?

- `by_cause`: migrations grouped by cause, direction (source -> destination
  processor, trace GPU indices with -1 = CPU) and size class: an upper bound
  on the migration's size (<=4KiB, <=64KiB, <=2MiB, >2MiB), not the page size
  the driver used (a tools migration event gives bytes, not pages: a 317 KiB
  prefetch is many 4 KiB or 64 KiB pages and sits in <=2MiB).
- `resident`: managed bytes resident on each GPU over time, estimated from
  first-touch GPU faults and migrations (see `resident`), against the GPU's
  memory: what oversubscription looks like from the driver's side.

The driver's own heuristics (uvm_events) are in driver_events.
"""

from __future__ import annotations

import polars as pl

from gputrace.analyses.helpers.common import BLOCK_2M

KiB = 1024


SIZE_CLASSES = ("<=4KiB", "<=64KiB", "<=2MiB", ">2MiB")


def size_class(col: str = "size_bytes") -> pl.Expr:
    """The size bucket of a migration, bounded by UVM's page sizes: <=4KiB, <=64KiB,
    <=2MiB or >2MiB. An upper bound on the size, not the page size used."""
    s = pl.col(col).cast(pl.Int64)
    return (pl.when(s <= 4 * KiB).then(pl.lit(SIZE_CLASSES[0]))
            .when(s <= 64 * KiB).then(pl.lit(SIZE_CLASSES[1]))
            .when(s <= 2048 * KiB).then(pl.lit(SIZE_CLASSES[2]))
            .otherwise(pl.lit(SIZE_CLASSES[3])))


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


def first_touch(migrations: pl.LazyFrame, faults: pl.LazyFrame) -> pl.LazyFrame:
    """(gpu_index, ts_ns, d = +2 MiB) per 2 MiB block that a GPU populated by touching it
    first: the block's earliest fault (CPU or GPU, same process) is a GPU fault of that
    GPU, and its earliest migration, if any, comes later and leaves that GPU.

    The tools stream has no "populate" event: a page touched first by a GPU is
    allocated there by the fault's service with no migration, and the driver fills
    the whole 2 MiB block around it (the real H200 kernel writing 256 MiB faulted
    in all 128 blocks, but on 11,078 distinct 4 KiB pages)."""
    blk = pl.col("address").cast(pl.Int64) - pl.col("address").cast(pl.Int64) % BLOCK_2M
    f = (faults.filter(pl.col("address").is_not_null())
         .select("pid", blk.alias("block"), "ts_ns",
                 pl.when(pl.col("source") != "cpu").then(pl.col("gpu_index").cast(pl.Int64))
                 .alias("gpu"))
         .group_by("pid", "block").agg(
             pl.col("gpu").sort_by("ts_ns").first(), pl.col("ts_ns").min()))
    m = (migrations.select("pid", blk.alias("block"), pl.col("ts_ns").alias("m_ts"),
                           pl.col("src").cast(pl.Int64).alias("m_src"))
         .group_by("pid", "block").agg(pl.col("m_src").sort_by("m_ts").first(),
                                       pl.col("m_ts").min()))
    return (f.filter(pl.col("gpu").is_not_null()).join(m, on=["pid", "block"], how="left")
            .filter(pl.col("m_ts").is_null()
                    | ((pl.col("m_ts") >= pl.col("ts_ns")) & (pl.col("m_src") == pl.col("gpu"))))
            .select(pl.col("gpu").alias("gpu_index"), "ts_ns", pl.lit(BLOCK_2M, pl.Int64)
                    .alias("d")))


def resident(migrations: pl.LazyFrame, faults: pl.LazyFrame | None = None) -> pl.LazyFrame:
    """Peak and end of managed bytes resident on each GPU: blocks the GPU populated by
    touching them first (`first_touch`, counted as whole 2 MiB blocks), plus bytes
    migrated onto it, minus bytes migrated off it, in time order.

    An estimate: counted from the trace start, so memory already resident when
    recording began is missing; a block first touched by the CPU and then partly by
    the GPU counts only what migrated; freeing managed memory emits no tools event,
    so a block freed while on the GPU stays counted (`resident_end_bytes` is then an
    upper bound). `populated_bytes` is the first-touch part."""
    ft = (first_touch(migrations, faults) if faults is not None
          else pl.LazyFrame(schema={"gpu_index": pl.Int64, "ts_ns": pl.Int64, "d": pl.Int64}))
    moves = pl.concat([
        migrations.filter(pl.col("dst") >= 0).select(
            pl.col("dst").cast(pl.Int64).alias("gpu_index"), "ts_ns",
            pl.col("size_bytes").cast(pl.Int64).alias("d"), pl.lit(0, pl.Int64).alias("p")),
        migrations.filter(pl.col("src") >= 0).select(
            pl.col("src").cast(pl.Int64).alias("gpu_index"), "ts_ns",
            -pl.col("size_bytes").cast(pl.Int64).alias("d"), pl.lit(0, pl.Int64).alias("p")),
        ft.select("gpu_index", pl.col("ts_ns").cast(pl.Int64), "d", pl.col("d").alias("p")),
    ])
    # at equal times, bytes leaving count first: the peak is never two events' overlap
    return (moves.sort("gpu_index", "ts_ns", "d")
            .with_columns(r=pl.col("d").cum_sum().over("gpu_index"))
            .group_by("gpu_index").agg(
                pl.col("r").max().clip(lower_bound=0).alias("resident_peak_bytes"),
                pl.col("r").last().clip(lower_bound=0).alias("resident_end_bytes"),
                pl.col("p").sum().alias("populated_bytes"),
                pl.col("ts_ns").sort_by("r", descending=True).first().alias("peak_ts_ns"))
            .sort("gpu_index"))
