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

COUNTED = "counted_bytes"


_API, _RM, _UVM = (pl.col("layer") == k for k in ("api", "rm", "uvm"))


_LEAKED = pl.col("kind").is_not_null()


# (column, rows it reads, value, how the rows of one piece combine); strings are few
# on purpose: a piece's labels are its `what`, `rm_what`, `kind` and `freed_by`.
SPEC: list[tuple[str, pl.Expr, str | None, str]] = [
    ("api_count", _API, None, "count"), ("api_bytes", _API, "size_bytes", "sum"),
    ("api_leaked_count", _API & _LEAKED, None, "count"),
    ("api_leaked_bytes", _API & _LEAKED, "size_bytes", "sum"),
    ("leak_stack_id", _API & _LEAKED, "stack_id", "first_set"),
    ("stack_id", _API, "stack_id", "first_set"), ("api_free_ts_ns", _API, "free_ts_ns", "max"),
    ("rm_count", _RM, None, "count"), ("rm_leaked_count", _RM & _LEAKED, None, "count"),
    ("rm_handle", _RM, "id", "first"), ("rm_what", _RM, "what", "first"),
    ("rm_bytes", _RM, "size_bytes", "sum"), ("rm_alloc_ts_ns", _RM, "alloc_ts_ns", "first"),
    ("rm_free_ts_ns", _RM, "free_ts_ns", "first"),
    ("uvm_count", _UVM, None, "count"), ("uvm_bytes", _UVM, "size_bytes", "sum"),
    ("uvm_base", _UVM, "id", "first"), ("uvm_alloc_ts_ns", _UVM, "alloc_ts_ns", "first"),
    ("uvm_free_ts_ns", _UVM, "free_ts_ns", "first"),
    ("uvm_leaked_bytes", _UVM & _LEAKED, "size_bytes", "sum"),
]


COMMON = ["pid", "comm", "gpu_index", "alloc_ts_ns", "call_row", "exit_ts_ns"]


def _one(name: str, cond: pl.Expr, col: str | None, how: str) -> pl.Expr:
    """The column of a piece made of one row."""
    if how == "count":
        return cond.cast(pl.Int64).alias(name)
    if how == "sum":
        return pl.when(cond).then(pl.col(str(col))).otherwise(0).alias(name)
    return pl.when(cond).then(pl.col(str(col))).alias(name)


def _many(name: str, cond: pl.Expr, col: str | None, how: str) -> pl.Expr:
    """The column of a piece made of several rows (in row order)."""
    if how == "count":
        return cond.sum().cast(pl.Int64).alias(name)
    c = pl.col(str(col)).filter(cond)
    out = {"sum": c.sum(), "first": c.first(), "first_set": c.drop_nulls().first(),
           "max": c.max()}[how]
    return out.alias(name)


def _combined() -> list[pl.Expr]:
    """A piece's label, leak kind and who freed it, from its rows: its API allocations'
    when it has any (leaked ones first), else its RM object's, else its UVM mapping's."""
    has_api = _API.any()

    def pick(col: str) -> pl.Expr:
        return pl.coalesce(pl.col(col).filter(_RM).first(), pl.col(col).filter(_UVM).first())

    kind = pl.when(has_api).then(pl.col("kind").filter(_API & _LEAKED).first()).otherwise(
        pick("kind"))
    who = pl.when(has_api).then(pl.coalesce(pl.col("who").filter(_API & _LEAKED).first(),
                                            pl.lit("program"))).otherwise(pick("who"))
    what = pl.coalesce(pl.col("what").filter(_API).first(), pick("what"))
    return [what.alias("what"), kind.alias("kind"), who.alias("freed_by")]


def allocations(r: pl.DataFrame, api_pids: pl.DataFrame) -> pl.DataFrame:
    """One row per piece of memory, from `rows` (`api_pids`: pids with API calls)."""
    # Most pieces are one row: only the others need a group-by.
    joined = r.filter(pl.col("piece") != pl.col("_row"))["piece"].unique()
    many = (pl.col("piece") != pl.col("_row")) | pl.col("_row").is_in(joined.implode())
    single = r.filter(~many).select(
        "piece", *COMMON, "what", "kind", pl.col("who").alias("freed_by"),
        *(_one(*spec) for spec in SPEC))
    multi = r.filter(many).sort("_row").group_by("piece", maintain_order=True).agg(
        pl.col("pid").first(), pl.col("comm").drop_nulls().first(),
        pl.col("gpu_index").drop_nulls().first(), pl.col("alloc_ts_ns").min(),
        pl.col("call_row").drop_nulls().first(), pl.col("exit_ts_ns").first(),
        *_combined(), *(_many(*spec) for spec in SPEC))
    g = pl.concat([single, multi.select(single.columns)], how="vertical_relaxed")
    seen = pl.col("pid").is_in(api_pids["pid"].implode())
    cls = (pl.when(pl.col("api_count") > 0).then(pl.lit("api"))
           .when(seen).then(pl.lit("driver")).otherwise(pl.lit("unattributed")))
    has_rm = pl.col("rm_count") > 0
    counted = (pl.when(pl.col("class") == "api").then("api_leaked_bytes")
               .when(pl.col("class") == "driver").then(pl.lit(0, pl.Int64))
               .when(has_rm).then(pl.when(pl.col("rm_leaked_count") > 0)
                                  .then("rm_bytes").otherwise(0))
               .otherwise("uvm_leaked_bytes"))
    return g.with_columns(cls.alias("class")).with_columns(
        **{COUNTED: counted.fill_null(0)})
