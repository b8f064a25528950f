"""What did PyTorch's caching allocator hold over time, and where are its free bytes?

From a snapshot's allocator layer, through the replay (allocator/replay.py, the one
place the history is replayed backwards from the snapshot's state): per device and per
pool, reserved bytes (segments) and active bytes after each trace entry, sampled at
bucket ends. The second line is in the replay's terms: active bytes, the blocks'
rounded sizes (a multiple of 512 bytes) held by tensors or pending free on another
stream, as `torch.cuda.memory_allocated` counts them, not the bytes the tensors asked
for; the rounding is the allocator's internal free memory, which the segment map
shows.

The segment map is PyTorch's `segsum` drawn: each segment a bar, its blocks in
address order, the bytes tensors asked for, the rounding inside their blocks
(internal free) and the inactive blocks (free to reuse), so a user sees where the
free bytes are. The largest MAP_SEGMENTS segments of each device are drawn; at each
out-of-memory entry, the segments and blocks the replay rolls back to
(allocator/oom_state.py), each block in its rounded size.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from gputrace.analyses.allocator.oom_state import CacheMemory, has_oom, memory_at_ooms
from gputrace.analyses.allocator.replay import POOL_KEYS, end_state, entries, segment_rows
from gputrace.analyses.helpers.inputs import Inputs
from gputrace.analyses.timeseries.downsample import seconds_since_start

MAP_SEGMENTS = 40
"""Segments drawn per device in the segment map (largest first); the rest are counted."""
OOM_MAPS = 4
"""Out-of-memory entries whose segment map is drawn (the first ones, by device)."""

FREED = "segments freed before the snapshot"
"""The pool of an entry whose segment the snapshot no longer holds (its pool is not
recorded); such segments hold nothing at the end, so their line ends at zero."""


def allocator_state(inp: Inputs, buckets: int = 200) -> dict[str, Any]:
    """`devices` (every device the snapshot names), `series` (per device: t_s, reserved
    and active bytes at each bucket end, null before the kept history, and `pools`,
    the same per pool), `maps` (per device: segments with their blocks, at the end,
    then at the first OOM_MAPS out-of-memory entries, each with its `oom_t_s`)."""
    if not inp.has("allocator"):
        return {"recorded": False, "devices": [], "series": [], "maps": []}
    segs = segment_rows(inp).collect()
    end = end_state(inp).collect()
    rep = entries(inp).collect()
    blocks = inp.scan("allocator_blocks").collect()
    devices = sorted({int(d) for d in [*segs["device"], *rep["device"]]})
    span = max(inp.end_ns - inp.start_ns, 1)
    grid = [inp.start_ns + span * (i + 1) // buckets for i in range(buckets)]
    t_s = seconds_since_start(inp, pl.Series(grid))
    series = [_series(inp, d, end.filter(pl.col("device") == d),
                      rep.filter(pl.col("device") == d), grid, t_s) for d in devices]
    maps = [_segment_map(d, segs, blocks) for d in devices]
    if has_oom(inp):
        first = {(int(r["device"]), int(r["i"])) for r in rep.filter(pl.col("action") == "oom")
                 .sort("device", "i").head(OOM_MAPS).iter_rows(named=True)}
        at_oom = [(o, _map_of(int(o["device"]), mem, segs))
                  for o, _, mem in memory_at_ooms(inp, rep)
                  if (int(o["device"]), int(o["i"])) in first]
        for o, m in sorted(at_oom, key=lambda om: int(om[0]["i"])):
            t = seconds_since_start(inp, pl.Series([o["ts_ns"]]))[0]
            maps.append({**m, "oom_t_s": t, "requested_bytes": int(o["size"])})
    return {"recorded": True, "devices": devices, "series": series, "maps": maps}


def _sample(rows: pl.DataFrame, grid: list[int], cols: dict[str, str]
            ) -> dict[str, list[int | None]]:
    """The replay's `cols` (column: output name) just after the last entry stamped at or
    before each grid time (null before the first)."""
    timed = (rows.filter(pl.col("ts_ns").is_not_null()).select("ts_ns", *cols)
             .sort("ts_ns", maintain_order=True))
    got = (pl.DataFrame({"ts_ns": grid}).cast(pl.Int64)
           .join_asof(timed, on="ts_ns", strategy="backward", check_sortedness=False))
    return {name: [None if v is None else int(v) for v in got[c]] for c, name in cols.items()}


def _series(inp: Inputs, device: int, end: pl.DataFrame, rep: pl.DataFrame,
            grid: list[int], t_s: list[float]) -> dict[str, Any]:
    """One device's reserved and active bytes over time, in all and per pool."""
    reserved_end = int(end["reserved_bytes"].sum())
    active_end = int(end["active_bytes"].sum())
    out: dict[str, Any] = {"device": device, "t_s": t_s, "entries": rep.height,
                           "end_reserved_bytes": reserved_end,
                           "end_active_bytes": active_end}
    if rep.height == 0:
        out.update(reserved=[reserved_end] * len(grid), active=[active_end] * len(grid),
                   oom_t_s=[])
        return out
    out.update(_sample(rep, grid, {"reserved_bytes": "reserved", "active_bytes": "active"}))
    ooms = rep.filter(pl.col("action") == "oom")["ts_ns"].drop_nulls()
    out["oom_t_s"] = seconds_since_start(inp, ooms) if ooms.len() else []
    out["pools"] = _pool_series(end, rep, grid) if end.height else []
    return out


def _pool_label(pool: Any, pool_id: Any) -> str:
    if pool is None:
        return FREED
    return f"{pool} (pool {pool_id})" if pool_id not in (None, "0,0") else str(pool)


def _pool_series(end: pl.DataFrame, rep: pl.DataFrame, grid: list[int]
                 ) -> list[dict[str, Any]]:
    """The device's reserved and active bytes per pool (`large`, `small`, a private pool
    by its id, FREED), the replay's pool columns sampled; null before the device's kept
    history begins, as its totals are. A pool before its own first entry holds what
    that entry started from (its end state when it has none)."""
    times = rep["ts_ns"].drop_nulls()
    begun = int(times.min()) if times.len() else None  # type: ignore[arg-type]
    lines: dict[tuple[Any, Any], dict[str, list[int | None]]] = {}
    starts: dict[tuple[Any, Any], dict[str, int]] = {
        (r["pool_id"], r["pool"]): {"reserved": int(r["reserved_bytes"]),
                                    "active": int(r["active_bytes"])}
        for r in end.iter_rows(named=True)}
    # an entry without an address (oom, snapshot, user_defined) is in no pool
    with_addr = rep.filter(pl.col("address").is_not_null())
    for (pool_id, pool), p in with_addr.group_by(POOL_KEYS[1:], maintain_order=True):
        lines[(pool_id, pool)] = _sample(p, grid, {"pool_reserved_bytes": "reserved",
                                                   "pool_active_bytes": "active"})
        first = p.row(0, named=True)
        starts[(pool_id, pool)] = {
            "reserved": first["pool_reserved_bytes"] - first["d_reserved"],
            "active": first["pool_active_bytes"] - first["d_active"]}
    out = []
    for key, start in starts.items():
        got = lines.get(key) or {k: [None] * len(grid) for k in start}
        vals = {k: [None if begun is None or g < begun else (start[k] if v is None else v)
                    for g, v in zip(grid, got[k], strict=True)] for k in start}
        out.append({"pool": _pool_label(key[1], key[0]), **vals})
    return sorted(out, key=lambda p: str(p["pool"]))


def _segment_map(device: int, segs: pl.DataFrame, blocks: pl.DataFrame) -> dict[str, Any]:
    """One device's segments at the end, largest first, each with its blocks as pieces
    (offset, bytes, kind: allocated | internal free | free)."""
    s = (segs.filter(pl.col("device") == device)
         .sort(["reserved_bytes", "address"], descending=[True, False]))
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
                         "total_bytes": int(row["reserved_bytes"]), "pieces": pieces})
    return {"device": device, "segments": segments, "left_out": s.height - drawn.height}


def _map_of(device: int, mem: CacheMemory, segs: pl.DataFrame) -> dict[str, Any]:
    """One device's segments as the replay rolled them back (an OOM's instant), largest
    first: each live block allocated in its rounded size, the rest of the segment free
    (the history records no block splits nor requests of blocks freed later). A segment
    the snapshot no longer holds has pool `?`."""
    known = {int(r["address"]): r for r in
             segs.filter(pl.col("device") == device).iter_rows(named=True)}
    order = sorted(mem.runs(), key=lambda r: (-(r[1] - r[0]), r[0]))
    segments = []
    for start, end, inside in order[:MAP_SEGMENTS]:
        pieces, at = [], start
        for b, size in inside:
            if b > at:
                pieces.append({"offset": at - start, "bytes": b - at, "kind": "free"})
            pieces.append({"offset": b - start, "bytes": size, "kind": "allocated"})
            at = max(at, b + size)
        if at < end:
            pieces.append({"offset": at - start, "bytes": end - at, "kind": "free"})
        seg = known.get(start) or {}
        segments.append({"address": start, "pool": seg.get("pool", "?"),
                         "pool_id": seg.get("pool_id"), "stream": seg.get("stream"),
                         "total_bytes": end - start, "pieces": pieces})
    return {"device": device, "segments": segments, "left_out": max(len(order) - MAP_SEGMENTS, 0)}
