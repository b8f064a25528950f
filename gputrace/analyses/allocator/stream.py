"""The allocator replay of `replay.entries`, per device, in chunks of entries: what
`allocator-growth` reports (each device's start, end and peaks, a sampled series, and
what each stack retained) without holding every entry's state at once.

A snapshot with 10^7 trace entries made the whole-table replay (joins and windows over
every entry) hold several GiB; here the entries are read in chunks of `chunk_rows`
rows, in each device's order, and what one chunk needs of the others is carried:

- before the first pass: for each device and address, the `i` of its last
  `free_completed` (an `alloc` after it is still allocated at the end, its block's real
  size known from the snapshot's blocks): a table of addresses, not of entries;
- a first pass sums each device's deltas: the replay runs backwards from the
  snapshot's state, so its start is the snapshot's bytes minus what the entries added;
- a second pass runs the sums forwards from that start, keeping the peaks, the sampled
  rows of the series and the retained bytes per stack.

The figures equal `replay.entries` (tests/unit/analyses/test_allocator_stream.py
checks it with chunk boundaries inside a device's history).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from gputrace.analyses.allocator.replay import (
    ACTIVE,
    RESERVE,
    _alive_blocks,
    _rounded,
    _sign,
    end_state,
)
from gputrace.analyses.helpers.inputs import Inputs

CHUNK_ROWS = 250_000
"""Entries per chunk (at 10^7 entries, 250k: 816 MiB peak for the replay, 1M: ~980)."""

_KINDS = ("reserved", "active", "requested")
_COLS = ("device", "seq", "ts_ns", "action", "address", "size", "stack_id")


@dataclass
class _Device:
    """One device's running state across chunks."""

    first_i: int
    entries: int = 0
    totals: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_KINDS, 0))
    start: dict[str, int] = field(default_factory=dict)
    run: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_KINDS, 0))
    peak: dict[str, int] = field(default_factory=dict)
    peak_row: dict[str, Any] | None = None
    maps: int = 0
    unmaps: int = 0
    first_ts: int | None = None
    last_ts: int | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)


def _chunks(lf: pl.LazyFrame, rows: int) -> Iterator[pl.DataFrame]:
    """`lf` in its order, `rows` rows at a time (the last chunk shorter)."""
    for batch in lf.collect_batches(chunk_size=rows):
        for off in range(0, batch.height, rows):
            yield batch.slice(off, rows)


def _in_order(ev: pl.LazyFrame, rows: int) -> bool:
    """Are the rows already in (device, seq) order, as the importer writes them? (Then
    a chunk is read as it lies; otherwise the whole table is sorted first.)"""
    prev: tuple[Any, Any] | None = None
    for c in _chunks(ev.select("device", "seq"), rows):
        if c.height == 0:
            continue
        if c["device"].null_count() or c["seq"].null_count():
            return False
        d, s = c["device"], c["seq"]
        if prev is not None:
            d = pl.concat([pl.Series([prev[0]], dtype=d.dtype), d])
            s = pl.concat([pl.Series([prev[1]], dtype=s.dtype), s])
        dd, ds = d.diff().drop_nulls(), s.diff().drop_nulls()
        if not bool(((dd > 0) | ((dd == 0) & (ds > 0))).all()):
            return False
        prev = (c["device"][-1], c["seq"][-1])
    return True


def _source(inp: Inputs, rows: int) -> pl.LazyFrame:
    """The entries in each device's order, numbered `i` as `replay.entries` numbers
    them."""
    ev = inp.scan("allocator_events").select(
        *_COLS[:-2], pl.col("size_bytes").cast(pl.Int64).fill_null(0).alias("size"),
        "stack_id")
    if not _in_order(ev, rows):
        ev = ev.sort("device", "seq")
    return ev.with_row_index("i")


def _deltas(c: pl.DataFrame, last_free: pl.DataFrame, alive: pl.DataFrame) -> pl.DataFrame:
    """A chunk with `retained` (an alloc no later free_completed of its device and
    address pairs) and each entry's deltas, as `replay.entries` computes them."""
    c = c.join(last_free, on=["device", "address"], how="left", maintain_order="left")
    retained = (pl.col("action") == "alloc") & (
        pl.col("_last_free").is_null() | (pl.col("_last_free") < pl.col("i")))
    c = c.with_columns(retained=retained).join(
        alive, on=["device", "address"], how="left", maintain_order="left")
    block = pl.coalesce(pl.when(pl.col("retained")).then(pl.col("_real")),
                        _rounded(pl.col("size")))
    return c.with_columns(d_reserved=_sign(RESERVE) * pl.col("size"),
                          d_requested=_sign(ACTIVE) * pl.col("size"),
                          d_active=_sign(ACTIVE) * block).drop("_last_free", "_real")


@dataclass
class Replayed:
    """What `allocator-growth` reads of the replay."""

    entries: int
    devices: list[dict[str, Any]]
    """Per device, as `replay.per_device` gives them."""
    series: list[dict[str, Any]]
    """Per device, in order: the rows `growth._series` keeps of its replay."""
    by_stack: pl.DataFrame
    """Per stack_id: allocs, alloc_bytes, retained_count, retained_bytes."""


def _keep(d: _Device, max_points: int) -> pl.Expr:
    """The rows `growth._series` keeps of a device's `d.entries` (less its peak): every
    k-th and the last."""
    if d.entries <= max_points:
        return pl.lit(True)
    pos = pl.col("i").cast(pl.Int64) - d.first_i
    return (pos % -(-d.entries // max_points) == 0) | (pos == d.entries - 1)


def replay_streamed(inp: Inputs, max_points: int, chunk_rows: int = CHUNK_ROWS) -> Replayed:
    """The replay of every device, `chunk_rows` entries at a time; `max_points`: the
    series' sampling (`growth.MAX_POINTS`)."""
    src = _source(inp, chunk_rows)
    last_free = (src.filter(pl.col("action") == "free_completed")
                 .group_by("device", "address").agg(pl.col("i").max().alias("_last_free"))
                 .collect(engine="streaming"))
    alive = _alive_blocks(inp).select("device", "address", "_real").collect()
    end = end_state(inp).group_by("device").agg(
        pl.col("reserved_bytes").sum(), pl.col("active_bytes").sum()).collect()
    req = _alive_blocks(inp).group_by("device").agg(pl.col("_req").sum()).collect()
    anchor = {r["device"]: {"reserved": r["reserved_bytes"], "active": r["active_bytes"]}
              for r in end.iter_rows(named=True)}
    for r in req.iter_rows(named=True):
        anchor.setdefault(r["device"], {})["requested"] = r["_req"]
    devs: dict[Any, _Device] = {}
    # first pass: each device's entries and the sums of its deltas
    for c in _chunks(src, chunk_rows):
        c = _deltas(c, last_free, alive)
        for r in c.group_by("device", maintain_order=True).agg(
                pl.col("i").min(), pl.len().alias("n"),
                *(pl.col(f"d_{k}").sum() for k in _KINDS),
                (pl.col("action") == "segment_map").sum().alias("maps"),
                (pl.col("action") == "segment_unmap").sum().alias("unmaps"),
                pl.col("ts_ns").min().alias("t0"), pl.col("ts_ns").max().alias("t1"),
        ).iter_rows(named=True):
            d = devs.setdefault(r["device"], _Device(first_i=r["i"]))
            d.entries += r["n"]
            d.maps += r["maps"]
            d.unmaps += r["unmaps"]
            for k in _KINDS:
                d.totals[k] += r[f"d_{k}"]
            if r["t0"] is not None:
                d.first_ts = r["t0"] if d.first_ts is None else min(d.first_ts, r["t0"])
                d.last_ts = r["t1"] if d.last_ts is None else max(d.last_ts, r["t1"])
    for dev, d in devs.items():
        for k in _KINDS:
            d.start[k] = int(anchor.get(dev, {}).get(k) or 0) - d.totals[k]
            d.peak[k] = d.start[k]
    # second pass: the state after each entry, forwards from each device's start
    stacks: list[pl.DataFrame] = []
    total = 0
    for c in _chunks(src, chunk_rows):
        c = _deltas(c, last_free, alive)
        total += c.height
        stacks.append(c.filter(pl.col("action") == "alloc").group_by("stack_id").agg(
            pl.len().alias("allocs"), pl.col("size").sum().alias("alloc_bytes"),
            pl.col("retained").sum().alias("retained_count"),
            pl.col("size").filter(pl.col("retained")).sum().alias("retained_bytes")))
        for (dev,), part in c.group_by(["device"], maintain_order=True):
            d = devs[dev]
            part = part.with_columns(
                (pl.col(f"d_{k}").cum_sum() + (d.start[k] + d.run[k])).alias(f"{k}_bytes")
                for k in _KINDS)
            for k in _KINDS:
                added: Any = part[f"d_{k}"].sum()
                high: Any = part[f"{k}_bytes"].max()
                d.run[k] += int(added)
                d.peak[k] = max(d.peak[k], int(high or 0))
            cols = ("ts_ns", "i", "device", "seq", "action", "active_bytes",
                    "requested_bytes", "reserved_bytes")
            top = int(part["active_bytes"].arg_max() or 0)
            if d.peak_row is None or part["active_bytes"][top] > d.peak_row["active_bytes"]:
                d.peak_row = part.select(cols).row(top, named=True)
            d.rows.extend(part.select(cols).filter(_keep(d, max_points)).iter_rows(named=True))
    series: list[dict[str, Any]] = []
    for d in devs.values():
        rows = {r["i"]: r for r in d.rows}
        if d.peak_row is not None:
            rows.setdefault(d.peak_row["i"], d.peak_row)
        series.extend(rows[i] for i in sorted(rows))
    by_stack = (pl.concat(stacks) if stacks else pl.DataFrame(
        schema={"stack_id": pl.Int64, "allocs": pl.UInt32, "alloc_bytes": pl.Int64,
                "retained_count": pl.UInt32, "retained_bytes": pl.Int64}))
    by_stack = by_stack.group_by("stack_id").agg(pl.col("allocs", "alloc_bytes",
                                                        "retained_count", "retained_bytes").sum())
    return Replayed(total, [_device_row(dev, d) for dev, d in devs.items()], series, by_stack)


def _device_row(dev: Any, d: _Device) -> dict[str, Any]:
    end = {k: d.start[k] + d.totals[k] for k in _KINDS}
    return {
        "device": dev, "entries": d.entries,
        **{f"start_{k}_bytes": d.start[k] for k in _KINDS},
        **{f"end_{k}_bytes": end[k] for k in _KINDS},
        **{f"peak_{k}_bytes": d.peak[k] for k in _KINDS},
        "segment_maps": d.maps, "segment_unmaps": d.unmaps,
        "first_ts_ns": d.first_ts, "last_ts_ns": d.last_ts,
    }
