"""What did PyTorch's caching allocator hold over time, and where are its free bytes?

From a snapshot's allocator layer. A snapshot is taken at the end, and its history
keeps only the last entries, so the state over time is replayed backwards from the
snapshot's own state: per device, reserved bytes at the end (its segments) minus
what the later entries added (`segment_alloc` and `segment_map` add reserved bytes,
`segment_free` and `segment_unmap` remove them), and allocated bytes the same way
from the active blocks and the `alloc` / `free_completed` entries. Trace entries
carry the size the program asked for, so the allocated line is in requested bytes
(blocks' requested sizes at the end); the rounding is the allocator's internal free
memory, which the segment map shows.

The segment map is PyTorch's `segsum` drawn: each segment a bar, its blocks in
address order, the bytes tensors asked for, the rounding inside their blocks
(internal free) and the inactive blocks (free to reuse), so a user sees where the
free bytes are. The largest MAP_SEGMENTS segments of each device are drawn.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from gputrace.analyses.helpers.inputs import Inputs
from gputrace.analyses.timeseries.downsample import seconds_since_start

MAP_SEGMENTS = 40
"""Segments drawn per device in the segment map (largest first); the rest are counted."""
OOM_MAPS = 4
"""Out-of-memory entries whose segment map is drawn (the first ones, by device)."""

_RESERVED = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
_ALLOCATED = {"alloc": 1, "free_completed": -1}


def allocator_state(inp: Inputs, buckets: int = 200) -> dict[str, Any]:
    """`devices` (every device the snapshot names), `series` (per device: t_s, reserved
    and allocated bytes at each bucket end, null before the kept history, and `pools`,
    the same per pool), `maps` (per
    device: segments with their blocks, at the end) and `oom_t_s` (each OOM entry's
    time, per device)."""
    if not inp.has("allocator"):
        return {"recorded": False, "devices": [], "series": [], "maps": []}
    seg = inp.scan("allocator_segments").collect()
    blocks = inp.scan("allocator_blocks").collect()
    ev = inp.scan("allocator_events").select(
        "ts_ns", "seq", "device", "action", "address",
        pl.col("size_bytes").cast(pl.Int64).fill_null(0)).collect()
    devices = sorted({int(d) for d in [*seg["device"], *blocks["device"], *ev["device"]]})
    span = max(inp.end_ns - inp.start_ns, 1)
    grid = [inp.start_ns + span * (i + 1) // buckets for i in range(buckets)]
    t_s = seconds_since_start(inp, pl.Series(grid))
    series = [_series(inp, d, seg, blocks, ev, grid, t_s) for d in devices]
    maps = [_segment_map(d, seg, blocks) for d in devices]
    ooms = ev.filter(pl.col("action") == "oom").sort("device", "seq").head(OOM_MAPS)
    oom_t = seconds_since_start(inp, ooms["ts_ns"]) if ooms.height else []
    for o, t in zip(ooms.iter_rows(named=True), oom_t, strict=True):
        m = _map_at_entry(int(o["device"]), int(o["seq"]), seg, blocks, ev)
        maps.append({**m, "oom_t_s": t, "requested_bytes": int(o["size_bytes"])})
    return {"recorded": True, "devices": devices, "series": series, "maps": maps}


def _series(inp: Inputs, device: int, seg: pl.DataFrame, blocks: pl.DataFrame, ev: pl.DataFrame,
            grid: list[int], t_s: list[float]) -> dict[str, Any]:
    """One device's reserved and allocated bytes, replayed backwards from its end state."""
    reserved_end = int(seg.filter(pl.col("device") == device)["total_size_bytes"].sum())
    allocated_end = int(blocks.filter((pl.col("device") == device)
                                      & (pl.col("state") != "inactive"))
                        ["requested_size_bytes"].sum())
    e = ev.filter(pl.col("device") == device).sort("seq").with_columns(
        r=pl.col("action").replace_strict(_RESERVED, default=0, return_dtype=pl.Int64)
        * pl.col("size_bytes"),
        a=pl.col("action").replace_strict(_ALLOCATED, default=0, return_dtype=pl.Int64)
        * pl.col("size_bytes"))
    # the level after each entry: the end state less what the later entries added
    e = e.with_columns(
        reserved=reserved_end - (pl.col("r").sum() - pl.col("r").cum_sum()),
        allocated=allocated_end - (pl.col("a").sum() - pl.col("a").cum_sum()))
    out: dict[str, Any] = {"device": device, "t_s": t_s, "entries": e.height,
                           "end_reserved_bytes": reserved_end,
                           "end_allocated_bytes": allocated_end}
    if e.height == 0:
        out.update(reserved=[reserved_end] * len(grid), allocated=[allocated_end] * len(grid),
                   oom_t_s=[])
        return out
    sampled = (pl.DataFrame({"ts_ns": grid}).cast(pl.Int64)
               .join_asof(e.select("ts_ns", "reserved", "allocated").sort("ts_ns"),
                          on="ts_ns", strategy="backward", check_sortedness=False))
    out["reserved"] = [None if v is None else int(v) for v in sampled["reserved"]]
    out["allocated"] = [None if v is None else int(v) for v in sampled["allocated"]]
    ooms = e.filter(pl.col("action") == "oom")["ts_ns"]
    out["oom_t_s"] = seconds_since_start(inp, ooms) if ooms.len() else []
    out["pools"] = _pool_series(device, seg, blocks, e, grid)
    return out


FREED = "segments freed before the snapshot"
"""The pool of an entry whose segment the snapshot no longer holds (its pool is not
recorded); such segments hold nothing at the end, so their line ends at zero."""


def _pool_label(pool: Any, pool_id: Any) -> str:
    return f"{pool} (pool {pool_id})" if pool_id not in (None, "0,0") else str(pool)


def _pool_series(device: int, seg: pl.DataFrame, blocks: pl.DataFrame, e: pl.DataFrame,
                 grid: list[int]) -> list[dict[str, Any]]:
    """The device's reserved and allocated bytes per pool (`large`, `small`, a private
    pool by its id), replayed backwards like the totals: an entry belongs to the pool of
    the snapshot's segment holding its address."""
    segs = (seg.filter(pl.col("device") == device)
            .select(pl.col("address").alias("s_addr"),
                    (pl.col("address") + pl.col("total_size_bytes")).alias("s_end"),
                    pl.struct("pool", "pool_id").map_elements(
                        lambda r: _pool_label(r["pool"], r["pool_id"]),
                        return_dtype=pl.String).alias("pool_label"),
                    pl.col("total_size_bytes").alias("reserved_end"))
            .sort("s_addr"))
    if segs.height == 0:
        return []
    blk = (blocks.filter((pl.col("device") == device) & (pl.col("state") != "inactive"))
           .join(segs, left_on="segment_address", right_on="s_addr", how="left")
           .group_by("pool_label").agg(pl.col("requested_size_bytes").sum().alias("a_end")))
    ends = (segs.group_by("pool_label").agg(pl.col("reserved_end").sum())
            .join(blk, on="pool_label", how="left").with_columns(pl.col("a_end").fill_null(0)))
    tagged = (e.filter(pl.col("address").is_not_null()).sort("address")
              .join_asof(segs.select("s_addr", "s_end", "pool_label"), left_on="address",
                         right_on="s_addr", strategy="backward", check_sortedness=False)
              .with_columns(pool_label=pl.when(pl.col("address") < pl.col("s_end"))
                            .then("pool_label").otherwise(pl.lit(FREED)))
              .sort("seq"))
    out = []
    labels = sorted(set(ends["pool_label"]) | set(tagged["pool_label"]))
    for label in labels:
        end = ends.filter(pl.col("pool_label") == label)
        r_end = int(end["reserved_end"].sum()) if end.height else 0
        a_end = int(end["a_end"].sum()) if end.height else 0
        p = tagged.filter(pl.col("pool_label") == label).with_columns(
            reserved=r_end - (pl.col("r").sum() - pl.col("r").cum_sum()),
            allocated=a_end - (pl.col("a").sum() - pl.col("a").cum_sum()))
        vals: dict[str, list[int | None]]
        if p.height == 0:
            vals = {"reserved": [r_end] * len(grid), "allocated": [a_end] * len(grid)}
        else:
            sampled = (pl.DataFrame({"ts_ns": grid}).cast(pl.Int64)
                       .join_asof(p.select("ts_ns", "reserved", "allocated").sort("ts_ns"),
                                  on="ts_ns", strategy="backward", check_sortedness=False))
            vals = {k: [None if v is None else int(v) for v in sampled[k]]
                    for k in ("reserved", "allocated")}
        out.append({"pool": label, **vals})
    return out


def _segment_map(device: int, seg: pl.DataFrame, blocks: pl.DataFrame) -> dict[str, Any]:
    """One device's segments at the end, largest first, each with its blocks as pieces
    (offset, bytes, kind: allocated | internal free | free)."""
    s = (seg.filter(pl.col("device") == device)
         .sort(["total_size_bytes", "address"], descending=[True, False]))
    drawn = s.head(MAP_SEGMENTS)
    b = blocks.filter(pl.col("device") == device).sort("address")
    segments = []
    for row in drawn.iter_rows(named=True):
        pieces = []
        for blk in b.filter(pl.col("segment_address") == row["address"]).iter_rows(named=True):
            off = int(blk["address"]) - int(row["address"])
            size = int(blk["size_bytes"])
            if blk["state"] == "inactive":
                pieces.append({"offset": off, "bytes": size, "kind": "free"})
                continue
            asked = min(int(blk["requested_size_bytes"] or size), size)
            pieces.append({"offset": off, "bytes": asked, "kind": "allocated"})
            if size > asked:
                pieces.append({"offset": off + asked, "bytes": size - asked,
                               "kind": "internal free"})
        segments.append({"address": int(row["address"]), "pool": row["pool"],
                         "pool_id": row["pool_id"], "stream": row["stream"],
                         "total_bytes": int(row["total_size_bytes"]), "pieces": pieces})
    return {"device": device, "segments": segments, "left_out": s.height - drawn.height}


def _map_at_entry(device: int, seq: int, seg: pl.DataFrame, blocks: pl.DataFrame,
                  ev: pl.DataFrame) -> dict[str, Any]:
    """One device's segments at the instant of its trace entry `seq` (an OOM), replayed
    backwards from the snapshot: the later entries undone (an `alloc` removes its block,
    a `free_completed` brings it back, segment entries likewise). Trace entries carry
    requested sizes and no block splits, so a segment's tensors are drawn in requested
    bytes and the rest of it as free."""
    segs = {int(r["address"]): int(r["total_size_bytes"]) for r in
            seg.filter(pl.col("device") == device).iter_rows(named=True)}
    pools = {int(r["address"]): r["pool"] for r in
             seg.filter(pl.col("device") == device).iter_rows(named=True)}
    live = {int(r["address"]): int(r["requested_size_bytes"] or r["size_bytes"]) for r in
            blocks.filter((pl.col("device") == device) & (pl.col("state") != "inactive"))
            .iter_rows(named=True)}
    later = ev.filter((pl.col("device") == device) & (pl.col("seq") > seq)).sort(
        "seq", descending=True)
    for e in later.iter_rows(named=True):
        addr, size, act = e["address"], int(e["size_bytes"]), e["action"]
        if addr is None:
            continue
        if act == "alloc":
            live.pop(int(addr), None)
        elif act == "free_completed":
            live[int(addr)] = size
        elif act in ("segment_alloc", "segment_map"):
            left = segs.get(int(addr), 0) - size
            if left > 0:
                segs[int(addr)] = left
            else:
                segs.pop(int(addr), None)
        elif act in ("segment_free", "segment_unmap"):
            segs[int(addr)] = segs.get(int(addr), 0) + size
    order = sorted(segs.items(), key=lambda kv: (-kv[1], kv[0]))
    starts = sorted(live)
    segments = []
    for addr, total in order[:MAP_SEGMENTS]:
        pieces, at = [], addr
        for b in (x for x in starts if addr <= x < addr + total):
            if b > at:
                pieces.append({"offset": at - addr, "bytes": b - at, "kind": "free"})
            pieces.append({"offset": b - addr, "bytes": live[b], "kind": "allocated"})
            at = max(at, b + live[b])
        if at < addr + total:
            pieces.append({"offset": at - addr, "bytes": addr + total - at, "kind": "free"})
        segments.append({"address": addr, "pool": pools.get(addr, "?"), "pool_id": None,
                         "stream": None, "total_bytes": total, "pieces": pieces})
    return {"device": device, "segments": segments, "left_out": max(len(order) - MAP_SEGMENTS, 0)}
