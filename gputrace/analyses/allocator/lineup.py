"""Do the live allocator layer and a snapshot of the same process agree?

A recording whose torch_allocator layer ran live can also hold the program's own
`_dump_snapshot()` (`import torch-snapshot --into`). Both describe the caching
allocator's tensors at the end; this compares them per device: the bytes held by
tensors at the end by each source, and the tensors themselves matched by address and
size.

A tensor is an `active_allocated` block: the live layer reports a free as done at
once, so the snapshot's `active_pending_free` blocks (freed, a stream still using
them) are not tensors for either side. Sizes compare the requested bytes when both
sources have them (the live layer rounds as PyTorch's default rounding does, a
snapshot's block may be bigger when the allocator did not split it), the block sizes
otherwise.
"""

from __future__ import annotations

import polars as pl

COLUMNS = ("device", "live_bytes_live", "live_bytes_snapshot", "matched", "only_live",
           "only_snapshot")
"""One row per device: bytes in tensors at the end by each source; tensors of the same
address and size in both, and in one source only."""


def _tensors(blocks: pl.LazyFrame) -> pl.LazyFrame:
    return (blocks.filter(pl.col("state") == "active_allocated")
            .select("device", "address", "size_bytes", "requested_size_bytes"))


def line_up_sources(live: pl.LazyFrame, snapshot: pl.LazyFrame) -> pl.DataFrame:
    """Per device, how the live layer's allocator_blocks and a snapshot's agree (COLUMNS)."""
    a, b = _tensors(live), _tensors(snapshot)
    both = a.join(b, on=("device", "address"), how="inner", suffix="_snap").filter(
        pl.when(pl.col("requested_size_bytes").is_not_null()
                & pl.col("requested_size_bytes_snap").is_not_null())
        .then(pl.col("requested_size_bytes") == pl.col("requested_size_bytes_snap"))
        .otherwise(pl.col("size_bytes") == pl.col("size_bytes_snap")))
    matched = both.group_by("device").agg(pl.len().cast(pl.Int64).alias("matched"))
    counts = [t.group_by("device").agg(pl.len().cast(pl.Int64).alias(n),
                                       pl.col("size_bytes").sum().cast(pl.Int64).alias(by))
              for t, n, by in ((a, "n_live", "live_bytes_live"),
                               (b, "n_snap", "live_bytes_snapshot"))]
    devices = pl.concat([a.select("device"), b.select("device")]).unique()
    out = devices
    for f in (*counts, matched):
        out = out.join(f, on="device", how="left")
    return (out.with_columns(pl.col(c).fill_null(0) for c in
                             ("n_live", "n_snap", "live_bytes_live", "live_bytes_snapshot",
                              "matched"))
            .with_columns((pl.col("n_live") - pl.col("matched")).alias("only_live"),
                          (pl.col("n_snap") - pl.col("matched")).alias("only_snapshot"))
            .select(COLUMNS).sort("device").collect())


def lineup_text(frame: pl.DataFrame) -> list[str]:
    """One line per device of a line_up_sources frame, for the import's result."""
    return [f"device {d}: tensors at the end {lb:,} B live, {sb:,} B in the snapshot; "
            f"{m} matched by address and size, {ol} only live, {os_} only in the snapshot"
            for d, lb, sb, m, ol, os_ in frame.select(COLUMNS).iter_rows()]
