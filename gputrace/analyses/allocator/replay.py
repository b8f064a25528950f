"""How much did PyTorch's caching allocator hold at any instant of its history, on each
device and in each pool?

A snapshot is taken at the end of its history: its segments and blocks are the state
after the last trace entry. So each device's entries are replayed backwards from that
state: the bytes reserved just after entry i are the snapshot's reserved bytes minus
what the entries after i added (`segment_alloc`, `segment_map`) plus what they released
(`segment_free`, `segment_unmap`). A history that lost its first entries (PyTorch keeps
the last `max_entries`) still ends right; one replayed forwards from zero would not.

Two sizes are kept apart, as PyTorch's `segsum` keeps them:

- requested bytes: what the program asked for. Trace entries carry this size
  (`alloc`, `free_completed`), blocks carry it as `requested_size`;
- active bytes: the blocks' rounded sizes (a multiple of 512 bytes, a large block
  possibly more when the rest of its segment was too small to split off). A block
  alive at the end has its real size; one allocated and freed within the history is
  counted at its request rounded up to 512 bytes (its real size is not recorded).
  The difference is "internal" free memory: reserved, held by no tensor, and usable
  by no other request.

The cache's free bytes are reserved minus active. No figure adds two devices: every
column is per device (and per pool: the segment of the snapshot an entry's address
lies in names its pool; an address in no segment of the snapshot belongs to a segment
released before the end, pool unknown, its bytes back to 0 by the end).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from gputrace.analyses.helpers.inputs import Inputs

MIN_BLOCK = 512
"""PyTorch's kMinBlockSize: every block is a multiple of it."""

RESERVE = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
ACTIVE = {"alloc": 1, "free_completed": -1}
POOL_KEYS = ["device", "pool_id", "pool"]


def _sign(table: dict[str, int]) -> pl.Expr:
    return pl.col("action").replace_strict(table, default=0, return_dtype=pl.Int64)


def _rounded(size: pl.Expr) -> pl.Expr:
    return (((size + MIN_BLOCK - 1) // MIN_BLOCK) * MIN_BLOCK).clip(lower_bound=MIN_BLOCK)


def segment_rows(inp: Inputs) -> pl.LazyFrame:
    """One row per segment of the snapshot, its bytes counted from its blocks: reserved,
    allocated (blocks held by tensors), active (also those pending free on another
    stream), requested (what the tensors asked for), internal free (allocated minus
    requested: the rounding), inactive (free, "external") and the largest inactive
    block. A segment listed without blocks keeps its own allocated and active sizes."""
    size = pl.col("size_bytes").cast(pl.Int64)
    state = pl.col("state")
    blocks = (inp.scan("allocator_blocks").group_by("device", "segment_address").agg(
        size.filter(state == "active_allocated").sum().alias("_allocated"),
        size.filter(state != "inactive").sum().alias("_active"),
        pl.col("requested_size_bytes").cast(pl.Int64).filter(state == "active_allocated")
        .sum().alias("_requested"),
        pl.col("requested_size_bytes").filter(state == "active_allocated").null_count()
        .alias("_requested_unknown"),
        size.filter(state == "inactive").sum().alias("inactive_bytes"),
        size.filter(state == "inactive").max().alias("largest_inactive_bytes"),
        pl.len().alias("blocks")))
    segs = inp.scan("allocator_segments").join(
        blocks, left_on=["device", "address"], right_on=["device", "segment_address"],
        how="left")
    has = pl.col("blocks").fill_null(0) > 0
    total = pl.col("total_size_bytes").cast(pl.Int64)
    allocated = pl.when(has).then(pl.col("_allocated")).otherwise(
        pl.col("allocated_size_bytes").cast(pl.Int64))
    active = pl.when(has).then(pl.col("_active")).otherwise(
        pl.col("active_size_bytes").cast(pl.Int64))
    requested = (pl.when(has & (pl.col("_requested_unknown") == 0))
                 .then(pl.col("_requested"))
                 .when(~has).then(pl.col("requested_size_bytes").cast(pl.Int64))
                 .otherwise(None))
    return segs.select(
        "pid", "device", "address", "pool", "pool_id", "stream", "is_expandable",
        total.alias("reserved_bytes"), allocated.alias("allocated_bytes"),
        active.alias("active_bytes"), requested.alias("requested_bytes"),
        (allocated - requested).alias("internal_free_bytes"),
        (total - allocated).alias("reserved_unallocated_bytes"),
        (total - active).alias("cache_free_bytes"),
        pl.when(has).then(pl.col("inactive_bytes").fill_null(0))
        .otherwise(total - active).alias("inactive_bytes"),
        pl.when(has).then(pl.col("largest_inactive_bytes").fill_null(0))
        .otherwise(None).alias("largest_inactive_bytes"))


def end_state(inp: Inputs) -> pl.LazyFrame:
    """Per device and pool (pool_id, `large`/`small`): the snapshot's bytes."""
    return segment_rows(inp).group_by(POOL_KEYS).agg(
        pl.len().alias("segments"),
        *(pl.col(c).sum() for c in ("reserved_bytes", "allocated_bytes", "active_bytes",
                                    "internal_free_bytes", "reserved_unallocated_bytes",
                                    "cache_free_bytes", "inactive_bytes")),
        pl.col("requested_bytes").sum().alias("requested_bytes"),
        pl.col("largest_inactive_bytes").max())


def _alive_blocks(inp: Inputs) -> pl.LazyFrame:
    """Blocks holding memory at the end (allocated or pending free): their real sizes
    and requests, the anchors of the active and requested replay."""
    return (inp.scan("allocator_blocks").filter(pl.col("state") != "inactive")
            .select("device", "address", pl.col("size_bytes").cast(pl.Int64).alias("_real"),
                    pl.coalesce("requested_size_bytes", "size_bytes").cast(pl.Int64)
                    .alias("_req")))


def _pools(inp: Inputs, ev: pl.LazyFrame) -> pl.LazyFrame:
    """`ev` plus the pool_id and pool of the snapshot segment its address lies in (an
    expandable segment's addresses run past its mapped size up to the next one)."""
    segs = (inp.scan("allocator_segments")
            .select("device", pl.col("address").alias("_seg"),
                    (pl.col("address") + pl.col("total_size_bytes")).alias("_seg_end"),
                    "pool_id", "pool", "is_expandable")
            .sort("_seg"))
    with_addr = ev.filter(pl.col("address").is_not_null()).sort("address")
    matched = with_addr.join_asof(segs, left_on="address", right_on="_seg", by="device",
                                  strategy="backward", check_sortedness=False)
    inside = (pl.col("address") < pl.col("_seg_end")) | pl.col("is_expandable").fill_null(False)
    matched = matched.with_columns(
        pl.when(inside).then(pl.col("pool_id")).otherwise(None).alias("pool_id"),
        pl.when(inside).then(pl.col("pool")).otherwise(None).alias("pool"),
        inside.fill_null(False).alias("in_snapshot_segment"),
    ).drop("_seg", "_seg_end", "is_expandable")
    no_addr = ev.filter(pl.col("address").is_null()).with_columns(
        pl.lit(None, pl.String).alias("pool_id"), pl.lit(None, pl.String).alias("pool"),
        pl.lit(False).alias("in_snapshot_segment"))
    return pl.concat([matched, no_addr], how="vertical_relaxed")


def paired_allocs(ev: pl.LazyFrame) -> pl.LazyFrame:
    """The `alloc` rows of `ev` (trace entries numbered `i` in each device's order, as
    `entries` numbers them), each with `free_i`: the `i` of the next `free_completed` of
    its device and address, null when the block is still allocated at the end."""
    frees = (ev.filter(pl.col("action") == "free_completed")
             .select("device", "address", pl.col("i").alias("free_i")).sort("free_i"))
    return (ev.filter(pl.col("action") == "alloc").sort("i")
            .join_asof(frees, left_on="i", right_on="free_i", by=["device", "address"],
                       strategy="forward", check_sortedness=False))


def entries(inp: Inputs, pools: bool = True) -> pl.LazyFrame:
    """Every trace entry in each device's order (`i` counts all devices, device by
    device) with the state just after it, on its device: reserved_bytes,
    active_bytes (rounded), requested_bytes, cache_free_bytes; and in its pool:
    pool_reserved_bytes, pool_active_bytes (`pools=False`: not those, nor the pool
    columns: the same rows and device figures without matching every address to its
    segment, for a report of devices only)."""
    size = pl.col("size_bytes").cast(pl.Int64).fill_null(0)
    ev = (inp.scan("allocator_events")
          .select("pid", "device", "seq", "ts_ns", "action", "address", "stream", "stack_id",
                  "device_free_bytes", size.alias("size"))
          .sort("device", "seq").with_row_index("i"))
    # the real size of a block allocated by its last alloc and alive at the end
    alive = _alive_blocks(inp)
    allocs = (paired_allocs(ev.select("i", "action", "device", "address"))
              .join(alive, on=["device", "address"], how="left")
              .select("i", pl.when(pl.col("free_i").is_null()).then(pl.col("_real"))
                      .otherwise(None).alias("_real")))
    ev = (ev.join(allocs, on="i", how="left")
          .with_columns(block=pl.coalesce(pl.col("_real"), _rounded(pl.col("size"))))
          .with_columns(d_reserved=_sign(RESERVE) * pl.col("size"),
                        d_requested=_sign(ACTIVE) * pl.col("size"),
                        d_active=_sign(ACTIVE) * pl.col("block"))
          .drop("_real", "block"))
    end = end_state(inp)
    dev_end = end.group_by("device").agg(
        pl.col("reserved_bytes").sum().alias("_r"), pl.col("active_bytes").sum().alias("_a"))
    req_end = alive.group_by("device").agg(pl.col("_req").sum().alias("_q"))
    if pools:
        ev = _pools(inp, ev)
    ev = ev.join(dev_end, on="device", how="left").join(req_end, on="device", how="left")
    if pools:
        ev = ev.join(end.select(*POOL_KEYS, pl.col("reserved_bytes").alias("_pr"),
                                pl.col("active_bytes").alias("_pa")),
                     # a format without pool ids (null) still has its pools; an entry in
                     # no snapshot segment (pool null) matches none: it ends at zero
                     on=POOL_KEYS, how="left", nulls_equal=True)
    anchors = ["_r", "_a", "_q", *(["_pr", "_pa"] if pools else [])]
    ev = ev.with_columns(pl.col(anchors).fill_null(0)).sort("i")

    def back(anchor: str, delta: str, over: list[str]) -> pl.Expr:
        return (pl.col(anchor) - pl.col(delta).sum().over(over)
                + pl.col(delta).cum_sum().over(over))

    per_pool = {"pool_reserved_bytes": back("_pr", "d_reserved", POOL_KEYS),
                "pool_active_bytes": back("_pa", "d_active", POOL_KEYS)} if pools else {}
    return ev.with_columns(
        reserved_bytes=back("_r", "d_reserved", ["device"]),
        active_bytes=back("_a", "d_active", ["device"]),
        requested_bytes=back("_q", "d_requested", ["device"]),
        **per_pool,
    ).with_columns(
        cache_free_bytes=pl.col("reserved_bytes") - pl.col("active_bytes"),
    ).drop(anchors)


def _max(s: pl.Series) -> int:
    v: Any = s.max()
    return int(v or 0)


def per_device(series: pl.DataFrame) -> list[dict[str, Any]]:
    """Per device: entries, the state before its first entry and after its last one,
    and the peaks (of that device alone)."""
    out: list[dict[str, Any]] = []
    for (dev,), d in series.sort("i").group_by(["device"], maintain_order=True):
        first, last = d.row(0, named=True), d.row(-1, named=True)
        start = {k: first[f"{k}_bytes"] - first[f"d_{k}"]
                 for k in ("reserved", "active", "requested")}
        times = d["ts_ns"].drop_nulls()
        out.append({
            "device": dev, "entries": d.height,
            "start_reserved_bytes": start["reserved"], "start_active_bytes": start["active"],
            "start_requested_bytes": start["requested"],
            "end_reserved_bytes": last["reserved_bytes"], "end_active_bytes": last["active_bytes"],
            "end_requested_bytes": last["requested_bytes"],
            "peak_reserved_bytes": max(_max(d["reserved_bytes"]), start["reserved"]),
            "peak_active_bytes": max(_max(d["active_bytes"]), start["active"]),
            "peak_requested_bytes": max(_max(d["requested_bytes"]), start["requested"]),
            "segment_maps": int((d["action"] == "segment_map").sum()),
            "segment_unmaps": int((d["action"] == "segment_unmap").sum()),
            "first_ts_ns": times.min() if times.len() else None,
            "last_ts_ns": times.max() if times.len() else None,
        })
    return out


def state_by_pid(inp: Inputs, device: int, at_ns: int | None) -> dict[int, tuple[int, int]]:
    """Per pid, (reserved, active) bytes of its caching allocator on `device` just after
    the last entry stamped at or before `at_ns` (before its first entry when none is;
    the snapshot's end state when the device has no entries)."""
    rep = entries(inp).filter(pl.col("device") == device).select(
        "pid", "i", "ts_ns", "reserved_bytes", "active_bytes", "d_reserved", "d_active"
    ).collect().sort("i")
    out: dict[int, tuple[int, int]] = {}
    if rep.height == 0:
        end = (segment_rows(inp).filter(pl.col("device") == device).group_by("pid")
               .agg(pl.col("reserved_bytes").sum(), pl.col("active_bytes").sum()).collect())
        for row in end.iter_rows(named=True):
            pid = row["pid"]
            out[int(pid) if pid is not None else -1] = (int(row["reserved_bytes"]),
                                                       int(row["active_bytes"]))
        return out
    for (pid,), d in rep.group_by(["pid"], maintain_order=True):
        key = int(pid) if pid is not None else -1
        upto = d if at_ns is None else d.filter(pl.col("ts_ns") <= at_ns)
        if upto.height:
            last = upto.row(-1, named=True)
            out[key] = (int(last["reserved_bytes"]), int(last["active_bytes"]))
        else:
            first = d.row(0, named=True)
            out[key] = (int(first["reserved_bytes"] - first["d_reserved"]),
                        int(first["active_bytes"] - first["d_active"]))
    return out
