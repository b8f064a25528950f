"""How much GPU memory did each process hold at an instant, and how much did it gain
over a window, each piece of memory counted once?

Every view of "who holds what" (the oom report's holders and sites, the holders
report, `--by container|pod`) reads this frame: one row per piece of memory of the
joined model (`pieces.allocations`), with ONE size taken from ONE layer:

- the RM memory object when the piece has one (what the driver accounts: the
  physical memory behind the API allocations sub-allocated in it and behind every
  UVM mapping of it),
- else its UVM mapping (managed memory, a mapping whose object the trace lacks),
- else its API allocations (an API-only trace).

The piece is held from that layer's allocation to that layer's free (a layer's
rows that were never freed are held to the end). Sizes of different layers are
never added: a holder's figure is a sum over its pieces, and each piece is at most
what its largest layer shows. A piece has a `class`, an attribute a view may break
a figure down by, never add to it:

- `program`: the program asked for it through the API (class api of the model);
- `allocator pool`: an API allocation made by a caching allocator that keeps memory
  by design (helpers/allocators.CACHED, from its stack);
- `CUDA context`: driver memory of a process that used the API, outside any API
  allocation (the context and the runtime: class driver of the model);
- `driver-only`: driver memory of a process whose API calls the trace lacks
  (class unattributed).

Host memory (cuMemAllocHost, cuMemHostAlloc, RM system-memory objects) holds none of
a GPU's and is left out.
"""

from __future__ import annotations

import polars as pl

from gputrace.analyses.helpers.allocators import CACHED, stack_allocators
from gputrace.analyses.helpers.partition import Slice
from gputrace.analyses.helpers.rm_objects import LABELS
from gputrace.nvabi import NV01_MEMORY_SYSTEM, NV01_MEMORY_SYSTEM_OS_DESCRIPTOR

HOST_MEMORY = ("cuMemAllocHost", "cuMemHostAlloc",
               *(LABELS[c] for c in (NV01_MEMORY_SYSTEM, NV01_MEMORY_SYSTEM_OS_DESCRIPTOR)))
"""`what` of the lifetime rows that are host memory (labels as rm_objects writes them)."""

CLASSES = ("program", "allocator pool", "CUDA context", "driver-only")
"""A piece's class (an attribute of a holder's figure, never added across)."""

HELD = ["pid", "comm", "gpu_index", "class", "layers", "size_layer", "what", "stack_id",
        "held_bytes", "from_ns", "until_ns", "exit_ts_ns"]
"""Columns of `held_pieces`."""


def _layers() -> pl.Expr:
    """Which layers saw the piece, as text: `api+rm+uvm`, `rm`, ..."""
    parts = [pl.when(pl.col(f"{k}_count") > 0).then(pl.lit(k)) for k in ("api", "rm", "uvm")]
    return pl.concat_str(parts, separator="+", ignore_nulls=True)


def of_size_layer(rm: str | pl.Expr, uvm: str | pl.Expr, api: str | pl.Expr) -> pl.Expr:
    """The column of the layer a piece's one size is taken from: `rm` when an RM object
    backs it, else `uvm` when an UVM mapping does, else `api` (reads `rm_count` and
    `uvm_count`). The live aggregates use the same rule (gputrace.live.live_bytes)."""
    return (pl.when(pl.col("rm_count") > 0).then(rm)
            .when(pl.col("uvm_count") > 0).then(uvm).otherwise(api))


def is_host_memory(*cols: str) -> pl.Expr:
    """Any of the `what` columns names host memory (holds none of a GPU's)."""
    return pl.any_horizontal([pl.col(c).is_in(list(HOST_MEMORY)).fill_null(False)
                              for c in cols])


def held_from(pieces: pl.DataFrame, allocators: pl.DataFrame) -> pl.DataFrame:
    """`HELD` columns of each GPU-memory piece of `pieces` (the joined model's frame),
    `allocators` the (pid, stack_id, allocator) of the stacks that matched one."""
    size_layer = of_size_layer(*(pl.lit(k) for k in ("rm", "uvm", "api")))
    cls = (pl.when(pl.col("class") == "driver").then(pl.lit("CUDA context"))
           .when(pl.col("class") == "unattributed").then(pl.lit("driver-only"))
           .when(pl.col("allocator").is_in(CACHED)).then(pl.lit("allocator pool"))
           .otherwise(pl.lit("program")))
    return (pieces.filter(~is_host_memory("what", "rm_what"))
            .join(allocators, on=["pid", "stack_id"], how="left")
            .with_columns(size_layer.alias("size_layer"), _layers().alias("layers"),
                          of_size_layer("rm_bytes", "uvm_bytes", "api_bytes").alias("held_bytes"),
                          of_size_layer("rm_alloc_ts_ns", "uvm_alloc_ts_ns", "alloc_ts_ns")
                          .alias("from_ns"),
                          of_size_layer("rm_free_ts_ns", "uvm_free_ts_ns", "api_free_ts_ns")
                          .alias("until_ns"))
            .with_columns(cls.alias("class"),
                          pl.coalesce("from_ns", "alloc_ts_ns").alias("from_ns"))
            .select(HELD))


def held_pieces(sl: Slice) -> pl.DataFrame:
    """The `HELD` frame of one pid slice (every piece, freed ones included)."""
    pieces = sl.model(held_only=False)[1]
    owners = stack_allocators(sl.inp.scan("stacks")).select(
        "pid", "stack_id", "allocator").collect()
    return held_from(pieces, owners)


def live_at(at_ns: int) -> pl.Expr:
    """The piece is held at `at_ns`."""
    return (pl.col("from_ns") <= at_ns) & (pl.col("until_ns").is_null()
                                           | (pl.col("until_ns") > at_ns))


def gained(start_ns: int, at_ns: int) -> pl.Expr:
    """+1 for a piece held at `at_ns` and not at `start_ns`, -1 for the reverse, else 0:
    a piece's size times this, summed, is what a holder gained over the window."""
    return live_at(at_ns).cast(pl.Int64) - live_at(start_ns).cast(pl.Int64)


def by_holder(held: pl.DataFrame, at_ns: int, start_ns: int | None = None) -> pl.DataFrame:
    """Per pid: `held_bytes` at `at_ns` (one figure), the same by class
    (`<class>_bytes`, attributes adding up to it) and by the layer the size was taken
    from, and with `start_ns`, `grew_bytes` over [start_ns, at_ns]."""
    live = live_at(at_ns)
    size = pl.col("held_bytes")
    aggs = [(size * live).sum().alias("held_bytes"), live.sum().cast(pl.Int64).alias("pieces")]
    aggs += [(size * live * (pl.col("class") == c)).sum().alias(f"{_key(c)}_bytes")
             for c in CLASSES]
    if start_ns is not None:
        aggs.append((size * gained(start_ns, at_ns)).sum().alias("grew_bytes"))
    return held.group_by("pid").agg(aggs).sort("pid")


def _key(cls: str) -> str:
    """`allocator pool` -> `allocator_pool` (a JSON key)."""
    return cls.lower().replace(" ", "_").replace("-", "_")


CLASS_KEYS = {c: f"{_key(c)}_bytes" for c in CLASSES}
"""The JSON key of each class's bytes in `by_holder`."""


def sites(held: pl.DataFrame, weight: pl.Expr, top: int) -> pl.DataFrame:
    """One process's pieces by (class, layers, what, stack) weighted by `weight` (1
    for held, `gained` for growth): bytes and count, largest first, the first `top`.
    Each piece is in one row, whatever the layers that saw it."""
    return (held.with_columns(w=weight)
            .group_by("class", "layers", "what", "stack_id")
            .agg((pl.col("held_bytes") * pl.col("w")).sum().alias("bytes"),
                 pl.col("w").sum().cast(pl.Int64).alias("count"))
            .filter(pl.col("bytes") != 0)
            .sort(["bytes", "class", "layers", "what", "stack_id"],
                  descending=[True, False, False, False, False], nulls_last=True)
            .head(top))
