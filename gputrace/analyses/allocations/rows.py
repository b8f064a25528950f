"""Which memory was still held when its process exited or the trace ended, and who
freed the rest?

Each memory lifetime row gets its piece (allocations_join.link), the exit of
its process instance, its leak kind (`unfreed_at_exit`, `alive_at_end` or
null) and who freed it (program, fd release, process exit, never): the rows
the `allocations` model is built from.
"""

from __future__ import annotations

import polars as pl

from gputrace.analyses.allocations.join import link
from gputrace.analyses.helpers.lifetimes import VIRTUAL_LAYERS


def with_exits(frame: pl.LazyFrame, processes: pl.LazyFrame, ts: str) -> pl.LazyFrame:
    """Add `exit_ts_ns` and `pcomm` of the process instance (pid) running at `ts`."""
    procs = processes.select(
        "pid", pl.col("start_ts_ns").fill_null(0).alias("_start"), "exit_ts_ns",
        pl.col("comm").alias("pcomm")).sort("_start")
    return frame.sort(ts).join_asof(procs, left_on=ts, right_on="_start", by="pid",
                                    strategy="backward", check_sortedness=False).drop("_start")


def leak_kind() -> pl.Expr:
    """unfreed_at_exit (process exited first), alive_at_end (unfreed, still running) or
    null (freed while its process ran)."""
    exit_, free = pl.col("exit_ts_ns"), pl.col("free_ts_ns")
    return (pl.when(exit_.is_not_null() & (free.is_null() | (free >= exit_)))
            .then(pl.lit("unfreed_at_exit"))
            .when(free.is_null()).then(pl.lit("alive_at_end")))


def _who() -> pl.Expr:
    k = pl.col("kind")
    return (pl.when(k == "unfreed_at_exit").then(pl.lit("process exit"))
            .when(k == "alive_at_end").then(pl.lit("never"))
            .when(pl.col("freed_by") == "close").then(pl.lit("fd release"))
            .otherwise(pl.lit("program")))


def rows(lt: pl.DataFrame, processes: pl.LazyFrame, end_ns: int,
         held_only: bool = False) -> pl.DataFrame:
    """Memory lifetime rows (of `lt`, every layer) with `_row`, `piece`, `call_row`,
    `kind`, `who`, `exit_ts_ns` and `age_s` (at trace end or process exit); with
    `held_only`, only the rows of pieces still holding memory at the end (a row with a
    leak kind): the rest is never materialized with its labels."""
    linked = link(lt)
    mem = ~pl.col("layer").is_in(list(VIRTUAL_LAYERS))
    if held_only:
        held = (with_exits(linked.lazy().filter(mem).select(
                    "piece", "pid", "alloc_ts_ns", "free_ts_ns"), processes, "alloc_ts_ns")
                .filter(leak_kind().is_not_null()).select("piece").unique().collect())
        mem = mem & pl.col("piece").is_in(held["piece"].implode())
    return (with_exits(linked.lazy().filter(mem), processes, "alloc_ts_ns")
            .with_columns(kind=leak_kind(), comm=pl.coalesce("pcomm", "comm"),
                          age_s=(pl.coalesce("exit_ts_ns", pl.lit(end_ns))
                                 - pl.col("alloc_ts_ns")) / 1e9)
            .with_columns(who=_who())
            .drop("tid", "call_end_ns", "client", "handle", "pcomm").collect())
