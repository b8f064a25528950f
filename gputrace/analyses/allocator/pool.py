"""How much of what PyTorch's caching allocator reserved is in use, and is the rest in
pieces too small to serve the next tensor?

Per segment and per pool (device, pool id, `large`/`small`; a private MemPool or a
CUDA graph's pool is its own pool, never folded into the default one, `0,0`): reserved
bytes (the segments, what CUDA handed out), allocated bytes (blocks held by tensors,
counted from the blocks), requested bytes (what the tensors asked for), internal free
(allocated minus requested: the rounding, as PyTorch's `segsum` reports it), "reserved
but unallocated" (as PyTorch's out-of-memory message calls it) and the largest
inactive block: the biggest tensor the cached memory can take without a new cudaMalloc
(a block is never split across segments). `fragmentation` is 1 - largest inactive /
inactive bytes: 0 when the cached free memory is one block. No figure adds two
devices: the headline is per device (`devices`), the one holding the most reserved
bytes first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import polars as pl

from gputrace.analyses.allocator import ONE_PROCESS
from gputrace.analyses.allocator.replay import POOL_KEYS, segment_rows
from gputrace.analyses.helpers.inputs import Inputs, trace_warnings
from gputrace.analyses.registry import unrecorded
from gputrace.analyses.report import Report
from gputrace.analyses.report_spec import DiffTable, ReportSpec

if TYPE_CHECKING:
    from gputrace.analyses.registry import Context


def _run(ctx: Context) -> Report:
    return pool(ctx.inp, ctx.opts.top)


SPEC = ReportSpec(
    "allocator-pool", "allocator_pool", "PyTorch allocator pool",
    "How much memory did PyTorch's caching allocator reserve but not allocate, and how "
    "big is its largest free block?",
    ("allocator",), _run,
    terminal="gputrace.render.allocator_sections:pool_section",
    html=("gputrace.render.allocator_html:pool_html",),
    diff=(DiffTable("allocator_pool", "PyTorch allocator pool", (), ("field",), ("value",)),
          DiffTable("allocator_pools", "PyTorch allocator per device and pool", ("pools",),
                    ("device", "pool"), ("reserved_bytes", "allocated_bytes",
                                         "reserved_unallocated_bytes",
                                         "largest_inactive_bytes", "segments"),
                    shown=("reserved_bytes", "allocated_bytes", "largest_inactive_bytes"),
                    is_bytes=True)),
    fleet=ONE_PROCESS, place=80)
QUESTION = SPEC.question

_SUMMED = ("reserved_bytes", "allocated_bytes", "active_bytes", "requested_bytes",
           "internal_free_bytes", "reserved_unallocated_bytes", "inactive_bytes")


def _share(free: pl.Expr, largest: pl.Expr) -> pl.Expr:
    return pl.when(free > 0).then(1 - largest / free).otherwise(None)


def pool(inp: Inputs, top: int | None = None) -> Report:
    """The allocator pool report: reserved vs allocated per segment, pool and device."""
    warnings = trace_warnings(inp)
    if (absent := unrecorded(SPEC, inp, warnings)) is not None:
        return absent
    segs = segment_rows(inp)
    sums = [pl.len().alias("segments"), *(pl.col(c).sum() for c in _SUMMED),
            pl.col("requested_bytes").null_count().alias("_unknown"),
            pl.col("largest_inactive_bytes").max()]
    frag = _share(pl.col("inactive_bytes"), pl.col("largest_inactive_bytes")).alias(
        "fragmentation")
    unknown = pl.col("_unknown") > 0
    fix = [pl.when(unknown).then(None).otherwise(pl.col(c)).alias(c)
           for c in ("requested_bytes", "internal_free_bytes")]
    pools = (segs.group_by(POOL_KEYS).agg(sums).with_columns(frag, *fix).drop("_unknown")
             .sort("device", "pool_id", "pool", nulls_last=True))
    devices = (segs.group_by("device").agg(sums).with_columns(frag, *fix).drop("_unknown")
               .sort(["reserved_bytes", "device"], descending=[True, False]))
    per_seg = segs.sort(["reserved_unallocated_bytes", "device", "address"],
                        descending=[True, False, False])
    seg_df, pool_df, dev_df = pl.collect_all([per_seg, pools, devices])
    seg_rows: list[dict[str, Any]] = seg_df.to_dicts()
    dev_rows: list[dict[str, Any]] = dev_df.to_dicts()
    head: dict[str, Any] = dev_rows[0] if dev_rows else {}
    if len(dev_rows) > 1:
        warnings.append(f"allocator-pool: {len(dev_rows)} devices; the headline is device "
                        f"{head['device']}'s (most reserved), `devices` lists each")
    data = {
        "device": head.get("device"),
        "reserved_bytes": int(head.get("reserved_bytes") or 0),
        "allocated_bytes": int(head.get("allocated_bytes") or 0),
        "active_bytes": int(head.get("active_bytes") or 0),
        "requested_bytes": head.get("requested_bytes"),
        "internal_free_bytes": head.get("internal_free_bytes"),
        "reserved_unallocated_bytes": int(head.get("reserved_unallocated_bytes") or 0),
        "largest_inactive_bytes": int(head.get("largest_inactive_bytes") or 0),
        "fragmentation": head.get("fragmentation"),
        "segment_count": int(head.get("segments") or 0),
        "devices": dev_rows,
        "pools": pool_df.to_dicts(),
        "segments": seg_rows[:top] if top is not None else seg_rows,
    }
    return Report("allocator-pool", QUESTION, True, data, [], warnings)
