"""When was each allocation made and when did it end, per layer?

One row per allocation instance with the same columns for every layer:
`layer` (api | rm | uvm), `pid`, `comm`, `id` (pointer, handle or address),
`what`, `size_bytes`, `alloc_ts_ns`, `free_ts_ns` (null: never freed in the
trace), `freed_by`, `stack_id`, `gpu_index`, and the evidence the joined
`allocations` model links layers by: `tid`, `call_end_ns` (when the allocating
call returned), `client` and `handle` (the RM object; for a UVM external mapping,
the RM object it maps). Leaks and the summary both start here. Address-space
reservations come as layers `rm-virtual` (RM virtual classes) and `uvm-virtual`
(UVM_CREATE_EXTERNAL_RANGE without the memory mapped into it): never memory.

Handles and addresses are reused after a free, so allocations are paired
with frees by an as-of join: each free matches the latest earlier allocation
of the same key, and an allocation keeps only the first free that matched it
(a double free does not end a later allocation). Failed calls never count.
"""

from __future__ import annotations

import polars as pl

from gputrace.analyses.helpers.inputs import Inputs
from gputrace.analyses.helpers.pairing import pair
from gputrace.analyses.helpers.rm_objects import rm_lifetimes
from gputrace.analyses.helpers.uvm_ranges import UVM_VIRTUAL_LAYER, uvm_lifetimes
from gputrace.trace.reader import SIZE_LIMIT

COLUMNS = {
    "layer": pl.String, "pid": pl.Int32, "comm": pl.String, "id": pl.UInt64,
    "what": pl.String, "size_bytes": pl.Int64, "alloc_ts_ns": pl.Int64,
    "free_ts_ns": pl.Int64, "freed_by": pl.String, "stack_id": pl.Int64,
    "gpu_index": pl.Int16, "tid": pl.Int32, "call_end_ns": pl.Int64, "client": pl.UInt32,
    "handle": pl.UInt32,
}


API_ALLOCS = {"cuMemAlloc": "ptr", "cuMemAllocPitch": "ptr", "cuMemAllocManaged": "ptr",
              "cuMemAllocHost": "ptr", "cuMemHostAlloc": "ptr", "cuMemAllocAsync": "ptr",
              "cuMemAllocFromPoolAsync": "ptr", "cuMemCreate": "handle"}


API_FREES = {"cuMemFree": "ptr", "cuMemFreeHost": "ptr", "cuMemFreeAsync": "ptr",
             "cuMemRelease": "handle"}


VIRTUAL_LAYERS = ("rm-virtual", UVM_VIRTUAL_LAYER)
"""Layers of address-space reservations: reported apart, never counted as memory."""


LAYER_SOURCES = {"api": "api", "rm": "syscall", "uvm": "syscall"}
"""Leak layer -> the trace layer whose tables it reads."""


API_SUFFIX = r"(_v\d+)?(_ptsz|_ptds)?$"
"""What a driver entry point's name adds to its function: cuMemAlloc_v2,
cuMemFreeAsync_ptsz -> cuMemAlloc, cuMemFreeAsync (the live aggregates strip it too)."""


def _base_func() -> pl.Expr:
    return pl.col("func").str.replace(API_SUFFIX, "")


def api_lifetimes(calls: pl.LazyFrame) -> pl.LazyFrame:
    """cuMem* allocations paired with their frees by (pid, pointer or handle)."""
    c = calls.filter(pl.col("result").fill_null(0) == 0).with_columns(base=_base_func())

    def keyed(table: dict[str, str], *cols: str) -> pl.LazyFrame:
        # `space`: True for a handle, False for a pointer (a bool keys faster than a string)
        space = pl.col("base").replace_strict({k: v == "handle" for k, v in table.items()},
                                              default=None, return_dtype=pl.Boolean)
        return (c.filter(pl.col("base").is_in(list(table)))
                .select(*cols, "ts_ns", "pid", "tid", space.alias("space"),
                        pl.when(space).then("handle").otherwise("ptr").alias("id")))

    allocs = keyed(API_ALLOCS, "comm", "base", "size_bytes", "stack_id", "latency_ns").filter(
        pl.col("id").fill_null(0) != 0)
    out = pair(allocs, keyed(API_FREES), ["pid", "space", "id"])
    return out.select(
        pl.lit("api").alias("layer"), "pid", "comm", "id", pl.col("base").alias("what"),
        "size_bytes", pl.col("ts_ns").alias("alloc_ts_ns"), "free_ts_ns",
        pl.when(pl.col("free_ts_ns").is_not_null()).then(pl.lit("free")).alias("freed_by"),
        "stack_id", pl.lit(None, pl.Int16).alias("gpu_index"), "tid",
        (pl.col("ts_ns") + pl.col("latency_ns").fill_null(0)).alias("call_end_ns"),
        pl.lit(None, pl.UInt32).alias("client"), pl.lit(None, pl.UInt32).alias("handle"),
    )


def lifetimes(inp: Inputs) -> pl.LazyFrame:
    """Allocation lifetimes of every layer the trace recorded."""
    parts = []
    if inp.has("api"):
        parts.append(api_lifetimes(inp.scan("cuda_calls")))
    if inp.has("syscall"):
        parts.append(rm_lifetimes(inp.scan("ioctls"), inp.scan("files")))
        parts.append(uvm_lifetimes(inp.scan("ioctls"), inp.scan("mappings")))
    if not parts:
        return pl.LazyFrame(schema=COLUMNS)
    return pl.concat([p.select([_column(k, v) for k, v in COLUMNS.items()]) for p in parts])


def _column(name: str, dtype: pl.DataType | type[pl.DataType]) -> pl.Expr:
    """Column `name` of the lifetimes frame. A size past SIZE_LIMIT (a traced process
    passed it; tracedir warns with the true value) counts as 0 bytes: it fits no Int64
    sum, and counted it would be the whole of every total."""
    if name != "size_bytes":
        return pl.col(name).cast(dtype)
    size = pl.col(name)
    return pl.when(size > SIZE_LIMIT).then(0).otherwise(size).cast(dtype).alias(name)


def recorded_layers(inp: Inputs) -> dict[str, bool]:
    """Which leak layers (api, rm, uvm) this trace can speak for."""
    return {layer: inp.has(src) for layer, src in LAYER_SOURCES.items()}


def memory(lt: pl.LazyFrame) -> pl.LazyFrame:
    """The rows of `lt` that are memory (address-space reservations dropped)."""
    return lt.filter(~pl.col("layer").is_in(list(VIRTUAL_LAYERS)))
