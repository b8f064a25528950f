"""When was each allocation made and when did it end, per layer?

One row per allocation instance with the same columns for every layer:
`layer` (api | rm | uvm), `pid`, `comm`, `id` (pointer, handle or address),
`what`, `size_bytes`, `alloc_ts_ns`, `free_ts_ns` (null: never freed in the
trace), `freed_by`, `stack_id`, `gpu_index`. Leaks and the summary both start
here. RM virtual reservations come as layer `rm-virtual` (not memory).

Handles and addresses are reused after a free, so allocations are paired
with frees by an as-of join: each free matches the latest earlier allocation
of the same key, and an allocation keeps only the first free that matched it
(a double free does not end a later allocation). Failed calls never count.
"""

from __future__ import annotations

import polars as pl

from gputrace.analyses.common import Inputs, ok_ioctl, pair
from gputrace.analyses.rm_objects import rm_lifetimes

COLUMNS = {
    "layer": pl.String, "pid": pl.Int32, "comm": pl.String, "id": pl.UInt64,
    "what": pl.String, "size_bytes": pl.Int64, "alloc_ts_ns": pl.Int64,
    "free_ts_ns": pl.Int64, "freed_by": pl.String, "stack_id": pl.Int64,
    "gpu_index": pl.Int16,
}
API_ALLOCS = {"cuMemAlloc": "ptr", "cuMemAllocPitch": "ptr", "cuMemAllocManaged": "ptr",
              "cuMemAllocHost": "ptr", "cuMemHostAlloc": "ptr", "cuMemAllocAsync": "ptr",
              "cuMemAllocFromPoolAsync": "ptr", "cuMemCreate": "handle"}
API_FREES = {"cuMemFree": "ptr", "cuMemFreeHost": "ptr", "cuMemFreeAsync": "ptr",
             "cuMemRelease": "handle"}
UVM_OPENS = ("UVM_CREATE_EXTERNAL_RANGE", "UVM_MAP_EXTERNAL_ALLOCATION")
UVM_CLOSES = ("UVM_FREE", "UVM_UNMAP_EXTERNAL")
LAYER_SOURCES = {"api": "api", "rm": "syscall", "uvm": "syscall"}
"""Leak layer -> the trace layer whose tables it reads."""


def _base_func() -> pl.Expr:
    return pl.col("func").str.replace(r"(_v\d+)?(_ptsz|_ptds)?$", "")


def api_lifetimes(calls: pl.LazyFrame) -> pl.LazyFrame:
    """cuMem* allocations paired with their frees by (pid, pointer or handle)."""
    c = calls.filter(pl.col("result").fill_null(0) == 0).with_columns(base=_base_func())

    def keyed(table: dict[str, str], *cols: str) -> pl.LazyFrame:
        # `space`: True for a handle, False for a pointer (a bool keys faster than a string)
        space = pl.col("base").replace_strict({k: v == "handle" for k, v in table.items()},
                                              default=None, return_dtype=pl.Boolean)
        return (c.filter(pl.col("base").is_in(list(table)))
                .select(*cols, "ts_ns", "pid", space.alias("space"),
                        pl.when(space).then("handle").otherwise("ptr").alias("id")))

    allocs = keyed(API_ALLOCS, "comm", "base", "size_bytes", "stack_id").filter(
        pl.col("id").fill_null(0) != 0)
    out = pair(allocs, keyed(API_FREES), ["pid", "space", "id"])
    return out.select(
        pl.lit("api").alias("layer"), "pid", "comm", "id", pl.col("base").alias("what"),
        "size_bytes", pl.col("ts_ns").alias("alloc_ts_ns"), "free_ts_ns",
        pl.when(pl.col("free_ts_ns").is_not_null()).then(pl.lit("free")).alias("freed_by"),
        "stack_id", pl.lit(None, pl.Int16).alias("gpu_index"),
    )


def uvm_lifetimes(ioctls: pl.LazyFrame, mappings: pl.LazyFrame) -> pl.LazyFrame:
    """Managed mmaps (ended by munmap) and external ranges (ended by UVM_FREE/UNMAP)."""
    mm = mappings.filter(pl.col("managed").fill_null(False) & (pl.col("op_code") == 1)
                         & (pl.col("ret").fill_null(0) >= 0))
    # Any successful munmap at the address ends the range mapped there: the
    # recorder cannot always say a munmap was of a managed range.
    un = mappings.filter((pl.col("op_code") == 2) & (pl.col("ret").fill_null(0) == 0))
    managed = pair(mm.with_columns(what=pl.lit("managed mmap")), un, ["pid", "addr"])
    managed = managed.rename({"addr": "id", "length": "size_bytes"})
    # An external range is opened by CREATE_EXTERNAL_RANGE and/or MAP_EXTERNAL at
    # the same base; consecutive opens of one base are one allocation.
    ev = (ioctls.filter(ok_ioctl() & pl.col("name").is_in([*UVM_OPENS, *UVM_CLOSES]))
          .with_columns(opens=pl.col("name").is_in(UVM_OPENS))
          .sort("ts_ns").with_columns(
              first=pl.col("opens") & ~pl.col("opens").shift(1).over(["pid", "va_base"])
              .fill_null(False)))
    ext = pair(ev.filter("first"), ev.filter(~pl.col("opens")), ["pid", "va_base"])
    ext = ext.select("pid", "comm", "ts_ns", "free_ts_ns", pl.col("va_base").alias("id"),
                     pl.col("va_length").alias("size_bytes"), what=pl.lit("external range"))
    cols = ["pid", "comm", "ts_ns", "free_ts_ns", "id", "size_bytes", "what"]
    both = pl.concat([managed.select(cols), ext.select(cols)], how="vertical_relaxed")
    return both.select(
        pl.lit("uvm").alias("layer"), "pid", "comm", "id", "what", "size_bytes",
        pl.col("ts_ns").alias("alloc_ts_ns"), "free_ts_ns",
        pl.when(pl.col("free_ts_ns").is_not_null()).then(pl.lit("free")).alias("freed_by"),
        pl.lit(None, pl.Int64).alias("stack_id"), pl.lit(None, pl.Int16).alias("gpu_index"),
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
    return pl.concat([p.select([pl.col(k).cast(v) for k, v in COLUMNS.items()])
                      for p in parts])


def recorded_layers(inp: Inputs) -> dict[str, bool]:
    """Which leak layers (api, rm, uvm) this trace can speak for."""
    return {layer: inp.has(src) for layer, src in LAYER_SOURCES.items()}
