"""Which pieces of GPU memory did the trace see, with every layer told once?

`allocations` joins the per-layer lifetimes (api, rm, uvm; reservations left
out) into one frame, one row per piece of memory (allocations_join.link says
which rows are one piece): the API allocations in it (with their stack), the RM
memory object backing it, the UVM mappings of it, alloc/free times per layer,
who freed it and its GPU. Each lifetime row is in exactly one piece.

Each piece has a `class`:
- `api`: the program asked for it through the API (one or more API allocations;
  several when the driver sub-allocates them from one RM object);
- `driver`: RM/UVM memory of a process that used the API, made outside any
  API allocation (the CUDA context and runtime) or beside one (`call_row`):
  the program never asked for it and the driver releases it when the process ends;
- `unattributed`: RM/UVM memory of a process whose API calls were not recorded
  (syscall-only traces): judged by its driver allocation, as before the join.

`counted_bytes` is what a leak of the piece counts in the one leak headline:
the API bytes of its leaked API allocations (class api), the bytes of its
driver allocation (class unattributed: the RM object, else its UVM mappings),
nothing for class driver. No memory is counted twice. See
docs/analyses/allocations.md.
"""

from __future__ import annotations

import polars as pl

from gputrace.analyses.allocations_join import link

COUNTED = "counted_bytes"


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


def rows(lt: pl.DataFrame, processes: pl.LazyFrame) -> pl.DataFrame:
    """Memory lifetime rows with `_row`, `piece`, `call_row`, `kind`, `who`, `exit_ts_ns`."""
    linked = link(lt).lazy()
    return (with_exits(linked, processes, "alloc_ts_ns")
            .with_columns(kind=leak_kind(), comm=pl.coalesce("pcomm", "comm"))
            .with_columns(who=_who()).sort("_row").collect())


def allocations(r: pl.DataFrame, api_pids: pl.DataFrame) -> pl.DataFrame:
    """One row per piece of memory, from `rows` (`api_pids`: pids with API calls)."""
    api, rm, uvm = (pl.col("layer") == k for k in ("api", "rm", "uvm"))
    leaked = pl.col("kind").is_not_null()

    def of(cond: pl.Expr, col: str) -> pl.Expr:
        return pl.col(col).filter(cond)

    g = r.sort("_row").group_by("piece", maintain_order=True).agg(
        pl.col("pid").first(), pl.col("comm").drop_nulls().first(),
        pl.col("gpu_index").drop_nulls().first(), pl.col("alloc_ts_ns").min(),
        api.sum().cast(pl.Int64).alias("api_count"),
        of(api, "size_bytes").sum().alias("api_bytes"),
        (api & leaked).sum().cast(pl.Int64).alias("api_leaked_count"),
        of(api & leaked, "size_bytes").sum().alias("api_leaked_bytes"),
        of(api, "id").alias("api_ids"), of(api, "what").first().alias("api_what"),
        of(api & leaked, "stack_id").drop_nulls().first().alias("leak_stack_id"),
        of(api, "stack_id").drop_nulls().first().alias("stack_id"),
        of(api, "free_ts_ns").max().alias("api_free_ts_ns"),
        of(api & leaked, "kind").first().alias("api_kind"),
        of(api & leaked, "who").first().alias("api_who"),
        rm.sum().cast(pl.Int64).alias("rm_count"),
        of(rm, "id").first().alias("rm_handle"), of(rm, "what").first().alias("rm_what"),
        of(rm, "size_bytes").sum().alias("rm_bytes"),
        of(rm, "alloc_ts_ns").first().alias("rm_alloc_ts_ns"),
        of(rm, "free_ts_ns").first().alias("rm_free_ts_ns"),
        of(rm, "kind").first().alias("rm_kind"), of(rm, "who").first().alias("rm_who"),
        uvm.sum().cast(pl.Int64).alias("uvm_count"),
        of(uvm, "size_bytes").sum().alias("uvm_bytes"),
        of(uvm, "id").first().alias("uvm_base"), of(uvm, "what").first().alias("uvm_what"),
        of(uvm, "alloc_ts_ns").first().alias("uvm_alloc_ts_ns"),
        of(uvm, "free_ts_ns").first().alias("uvm_free_ts_ns"),
        of(uvm & leaked, "size_bytes").sum().alias("uvm_leaked_bytes"),
        of(uvm, "kind").first().alias("uvm_kind"), of(uvm, "who").first().alias("uvm_who"),
        pl.col("call_row").drop_nulls().first(), pl.col("exit_ts_ns").first(),
    )
    seen = pl.col("pid").is_in(api_pids["pid"].implode())
    cls = (pl.when(pl.col("api_count") > 0).then(pl.lit("api"))
           .when(seen).then(pl.lit("driver")).otherwise(pl.lit("unattributed")))
    has_rm = pl.col("rm_count") > 0
    g = g.with_columns(cls.alias("class"))
    kind = (pl.when(pl.col("class") == "api").then("api_kind")
            .when(has_rm).then("rm_kind").otherwise("uvm_kind"))
    who = (pl.when(pl.col("class") == "api").then(pl.coalesce("api_who", pl.lit("program")))
           .when(has_rm).then("rm_who").otherwise("uvm_who"))
    counted = (pl.when(pl.col("class") == "api").then("api_leaked_bytes")
               .when(pl.col("class") == "driver").then(pl.lit(0, pl.Int64))
               .when(has_rm).then(pl.when(pl.col("rm_kind").is_not_null())
                                  .then("rm_bytes").otherwise(0))
               .otherwise("uvm_leaked_bytes"))
    return g.with_columns(kind=kind, freed_by=who, **{COUNTED: counted.fill_null(0)})
