"""How much GPU memory did each process still hold when it exited or the trace ended,
each piece counted once?

One figure per process from the joined allocation model (allocations/held.py): the
sum of its pieces, each sized by one layer, that were held at the process's exit (or
at the end of the trace for a process still running). Its classes (program,
allocator pool, CUDA context, driver-only) are attributes adding up to it; the
per-layer figures (`<layer>_layer_bytes`: what each layer alone shows of the leaked
memory) are a breakdown, never added to it. `--by pod|container` and the fleet's
holders add these figures up over processes (helpers/identity.by_identity).
"""

from __future__ import annotations

import polars as pl

from gputrace.analyses.allocations.held import CLASS_KEYS, held_pieces
from gputrace.analyses.helpers.partition import Slice

LAYERS = ("api", "rm", "uvm")
BREAKDOWN = tuple(f"{k}_layer_bytes" for k in LAYERS)
"""The per-layer breakdown columns (each layer alone; never added to `held_bytes`)."""
FIGURES = ("held_bytes", "pieces", *CLASS_KEYS.values())
"""The per-process figures that add up over processes (a pod's, a fleet's)."""


def held_end_part(sl: Slice) -> pl.DataFrame:
    """Per pid of the slice: `comm` and `FIGURES` at its exit, else at the trace's end."""
    held = held_pieces(sl)
    at = pl.coalesce("exit_ts_ns", pl.lit(sl.inp.end_ns))
    # held at `at`: a piece freed at the exit instant (the driver's teardown) counts,
    # the memory was the process's until it went
    live = ((pl.col("from_ns") <= at)
            & (pl.col("until_ns").is_null() | (pl.col("until_ns") >= at))).cast(pl.Int64)
    size = pl.col("held_bytes") * live
    return (held.group_by("pid")
            .agg(pl.col("comm").drop_nulls().last(), size.sum().alias("held_bytes"),
                 live.sum().alias("pieces"),
                 *[(size * (pl.col("class") == c)).sum().alias(k)
                   for c, k in CLASS_KEYS.items()])
            .filter(pl.col("held_bytes") > 0))


def held_end(parts: list[pl.DataFrame], by_layer: pl.DataFrame) -> pl.DataFrame:
    """Every slice's `held_end_part`, with the per-layer breakdown of `by_layer` (the
    leak report's per-layer (layer, pid, bytes) rows), largest first."""
    frame = pl.concat(parts) if parts else pl.DataFrame(
        schema={"pid": pl.Int32, "comm": pl.String, **dict.fromkeys(FIGURES, pl.Int64)})
    layer = (by_layer.filter(pl.col("layer").is_in(list(LAYERS)))
             .group_by("pid").agg(*[(pl.col("bytes") * (pl.col("layer") == k)).sum()
                                    .cast(pl.Int64).alias(f"{k}_layer_bytes")
                                    for k in LAYERS]))
    return (frame.join(layer, on="pid", how="left")
            .with_columns(pl.col(list(BREAKDOWN)).fill_null(0))
            .sort("held_bytes", "pid", descending=[True, False]))
