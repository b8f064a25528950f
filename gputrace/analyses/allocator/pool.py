"""How much of what PyTorch's caching allocator reserved is in use, and is the rest in
pieces too small to serve the next tensor?

Per segment and per pool (device, `large`/`small`): reserved bytes (the segments, what
CUDA handed out), allocated bytes (held by tensors), "reserved but unallocated" (the
difference, as PyTorch's out-of-memory message calls it) and the largest inactive
block: the biggest tensor the cached memory can take without a new cudaMalloc (a block
is never split across segments). `fragmentation` is 1 - largest inactive / inactive
bytes: 0 when the cached free memory is one block.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from gputrace.analyses.helpers.inputs import Inputs, trace_warnings
from gputrace.analyses.registry import spec, unrecorded
from gputrace.analyses.report import Report

SPEC = spec("allocator-pool")
QUESTION = SPEC.question




def _inactive(inp: Inputs) -> pl.LazyFrame:
    """Per segment: inactive bytes and the largest inactive block."""
    return (inp.scan("allocator_blocks").filter(pl.col("state") == "inactive")
            .group_by("device", "segment_address")
            .agg(pl.col("size_bytes").sum().alias("inactive_bytes"),
                 pl.col("size_bytes").max().alias("largest_inactive_bytes")))


def _share(free: pl.Expr, largest: pl.Expr) -> pl.Expr:
    return pl.when(free > 0).then(1 - largest / free).otherwise(None)


def pool(inp: Inputs, top: int | None = None) -> Report:
    """The allocator pool report: reserved vs allocated per segment, pool and in all."""
    warnings = trace_warnings(inp)
    if (absent := unrecorded(SPEC, inp, warnings)) is not None:
        return absent
    segs = (inp.scan("allocator_segments")
            .join(_inactive(inp), left_on=["device", "address"],
                  right_on=["device", "segment_address"], how="left")
            .with_columns(pl.col("inactive_bytes").fill_null(0),
                          pl.col("largest_inactive_bytes").fill_null(0))
            .select("device", "pool", "address", "pool_id",
                    pl.col("total_size_bytes").alias("reserved_bytes"),
                    pl.col("allocated_size_bytes").alias("allocated_bytes"),
                    pl.col("active_size_bytes").alias("active_bytes"),
                    (pl.col("total_size_bytes") - pl.col("allocated_size_bytes"))
                    .alias("reserved_unallocated_bytes"),
                    "inactive_bytes", "largest_inactive_bytes"))
    sums = [pl.len().alias("segments"), *(pl.col(c).sum() for c in (
        "reserved_bytes", "allocated_bytes", "active_bytes", "reserved_unallocated_bytes",
        "inactive_bytes")), pl.col("largest_inactive_bytes").max()]
    frag = _share(pl.col("inactive_bytes"), pl.col("largest_inactive_bytes")).alias(
        "fragmentation")
    pools = segs.group_by("device", "pool").agg(sums).with_columns(frag).sort("device", "pool")
    total = segs.select(sums).with_columns(frag)
    per_seg = segs.sort(["reserved_unallocated_bytes", "address"], descending=[True, False])
    seg_df, pool_df, tot_df = pl.collect_all([per_seg, pools, total])
    seg_rows: list[dict[str, Any]] = seg_df.to_dicts()
    t = tot_df.row(0, named=True)
    data = {
        "reserved_bytes": int(t["reserved_bytes"] or 0),
        "allocated_bytes": int(t["allocated_bytes"] or 0),
        "active_bytes": int(t["active_bytes"] or 0),
        "reserved_unallocated_bytes": int(t["reserved_unallocated_bytes"] or 0),
        "largest_inactive_bytes": int(t["largest_inactive_bytes"] or 0),
        "fragmentation": t["fragmentation"],
        "segment_count": int(t["segments"]),
        "pools": pool_df.to_dicts(),
        "segments": seg_rows[:top] if top is not None else seg_rows,
    }
    return Report("allocator-pool", QUESTION, True, data, [], warnings)
