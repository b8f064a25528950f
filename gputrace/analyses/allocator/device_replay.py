"""The allocator replay of `replay.entries`, per device, over whole columns: what
`allocator-growth` reports (each device's start, end and peaks, a sampled series, and
what each stack retained) in a few vector operations per device.

`replay.entries` keeps every column of every entry through its joins and windows (a
10^7-entry history held several GiB). Here the entries are read once, seven narrow
columns (~40 bytes an entry), and:

- each `alloc` is retained when no `free_completed` of its device and address comes
  after it (the `i` of the last one per address: a table of addresses, not a join over
  all entries); a retained block counts at its real size, from the snapshot's blocks;
- each device's deltas are summed: the replay runs backwards from the snapshot's
  state, so its start is the snapshot's bytes minus what the entries added; its running
  state is that start plus the running sum (numpy's cumsum over the device's rows).

The figures equal `replay.entries` (tests/unit/analyses/test_allocator_device_replay.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np
import polars as pl

from gputrace.analyses.allocator.replay import (
    ACTIVE,
    RESERVE,
    _alive_blocks,
    _rounded,
    end_state,
)
from gputrace.analyses.helpers.inputs import Inputs

_KINDS = ("reserved", "active", "requested")
_ACTIONS = ("alloc", "free_completed", *RESERVE)
"""The actions that move a figure, coded 1, 2, ... (every other one 0)."""
_CODE = {a: k for k, a in enumerate(_ACTIONS, 1)}
_SIGNS = {kind: np.array([0, *(table.get(a, 0) for a in _ACTIONS)], np.int64)
          for kind, table in (("reserved", RESERVE), ("active", ACTIVE))}
_SERIES = ("ts_ns", "i", "device", "seq", "action", "active_bytes", "requested_bytes",
           "reserved_bytes")


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


def _coded(action: pl.Expr) -> pl.Expr:
    """The action's code (a chain of comparisons: half of `replace_strict`'s cost)."""
    code = pl.lit(0, pl.UInt8)
    for a, k in reversed(_CODE.items()):
        code = pl.when(action == a).then(pl.lit(k, pl.UInt8)).otherwise(code)
    return code


def _entries(inp: Inputs) -> pl.DataFrame:
    """The entries in each device's order (numbered by position, as `replay.entries`
    numbers them `i`), the action coded, `_row` their row in the table; only what every
    entry's replay needs (what the sampled series adds is read for its rows alone)."""
    ev = inp.scan("allocator_events").with_row_index("_row").select(
        "_row", "device", "seq", "address",
        pl.col("size_bytes").cast(pl.Int64).fill_null(0).alias("size"), "stack_id",
        _coded(pl.col("action")).alias("_code")).collect(engine="streaming")
    d, s = ev["device"], ev["seq"]
    ordered = d.null_count() == 0 and s.null_count() == 0 and bool(
        ((d.diff() > 0) | ((d.diff() == 0) & (s.diff() > 0))).slice(1).all())
    return (ev if ordered else ev.sort("device", "seq")).drop("seq")


def _rows(inp: Inputs, rows: np.ndarray[Any, Any]) -> pl.DataFrame:
    """ts_ns, seq and action of these rows of the table, in this order."""
    want = pl.DataFrame({"_row": pl.Series(rows, dtype=pl.UInt32)})
    got = (inp.scan("allocator_events").with_row_index("_row")
           .filter(pl.col("_row").is_in(want["_row"].implode()))
           .select("_row", "ts_ns", "seq", "action").collect())
    return want.join(got, on="_row", how="left", maintain_order="left")


def _times(inp: Inputs) -> dict[Any, tuple[Any, Any]]:
    """Per device, its entries' first and last ts_ns (None when none has one)."""
    got = inp.scan("allocator_events").group_by("device").agg(
        pl.col("ts_ns").min().alias("t0"), pl.col("ts_ns").max().alias("t1")).collect()
    return {r["device"]: (r["t0"], r["t1"]) for r in got.iter_rows(named=True)}


def _blocks(ev: pl.DataFrame, inp: Inputs) -> tuple[np.ndarray[Any, Any],
                                                     np.ndarray[Any, Any]]:
    """(each entry's block bytes, which allocs are retained): the real size of a
    block its `alloc` left allocated at the end, the request rounded up otherwise."""
    block = ev.select(_rounded(pl.col("size"))).to_series().to_numpy(writable=True)
    retained = np.zeros(ev.height, bool)
    keyed = ev.lazy().with_row_index("i").select("i", "device", "address", "_code")
    last_free = (keyed.filter(pl.col("_code") == _CODE["free_completed"])
                 .group_by("device", "address").agg(pl.col("i").max().alias("_last_free")))
    alive = _alive_blocks(inp).select("device", "address", "_real").unique(
        ["device", "address"], keep="first")
    allocs = (keyed.filter(pl.col("_code") == _CODE["alloc"])
              .join(last_free, on=["device", "address"], how="left")
              .filter(pl.col("_last_free").is_null() | (pl.col("_last_free") < pl.col("i")))
              .join(alive, on=["device", "address"], how="left")
              .select("i", "_real").collect())
    at = allocs["i"].to_numpy().astype(np.int64)
    retained[at] = True
    real = allocs["_real"]
    known = ~real.is_null().to_numpy()
    block[at[known]] = real.filter(real.is_not_null()).to_numpy()
    return block, retained


def _anchors(inp: Inputs) -> dict[Any, dict[str, int]]:
    """Per device, the snapshot's reserved, active and requested bytes."""
    end = end_state(inp).group_by("device").agg(
        pl.col("reserved_bytes").sum(), pl.col("active_bytes").sum()).collect()
    req = _alive_blocks(inp).group_by("device").agg(pl.col("_req").sum()).collect()
    out: dict[Any, dict[str, int]] = {}
    for r in end.iter_rows(named=True):
        out[r["device"]] = {"reserved": r["reserved_bytes"], "active": r["active_bytes"]}
    for r in req.iter_rows(named=True):
        out.setdefault(r["device"], {})["requested"] = r["_req"]
    return out


def replay_devices(inp: Inputs, max_points: int) -> Replayed:
    """The replay of every device; `max_points`: the series' sampling
    (`growth.MAX_POINTS`: every k-th entry of a device, its first peak of active
    bytes, its last)."""
    ev = _entries(inp)
    n = ev.height
    if n == 0:
        return Replayed(0, [], [], pl.DataFrame(schema={
            "stack_id": pl.Int64, "allocs": pl.UInt32, "alloc_bytes": pl.Int64,
            "retained_count": pl.UInt32, "retained_bytes": pl.Int64}))
    code = ev["_code"].to_numpy()
    size = ev["size"].to_numpy()
    block, retained = _blocks(ev, inp)
    delta = {"reserved": _SIGNS["reserved"][code] * size,
             "active": _SIGNS["active"][code] * block,
             "requested": _SIGNS["active"][code] * size}
    del block
    anchor = _anchors(inp)
    dev = ev["device"]
    cuts = [0, *(np.flatnonzero(dev.diff().slice(1).to_numpy() != 0) + 1).tolist(), n]
    devices: list[dict[str, Any]] = []
    keep: list[int] = []
    # each delta becomes the running state in place (fresh arrays cost page faults:
    # three 80 MB arrays at 10^7 entries took longer than the sums)
    running = delta
    times = _times(inp)
    for a, b in pairwise(cuts):
        d = dev[a]
        row: dict[str, Any] = {"device": d, "entries": b - a}
        for k in _KINDS:
            part = running[k][a:b]
            np.cumsum(part, out=part)
            start = int(anchor.get(d, {}).get(k) or 0) - int(part[-1])
            part += start
            row[f"start_{k}_bytes"] = start
        for k in _KINDS:
            row[f"end_{k}_bytes"] = int(running[k][b - 1])
        for k in _KINDS:
            row[f"peak_{k}_bytes"] = max(row[f"start_{k}_bytes"], int(running[k][a:b].max()))
        row["segment_maps"] = int((code[a:b] == _CODE["segment_map"]).sum())
        row["segment_unmaps"] = int((code[a:b] == _CODE["segment_unmap"]).sum())
        row["first_ts_ns"], row["last_ts_ns"] = times.get(d, (None, None))
        devices.append(row)
        count = b - a
        step = -(-count // max_points) if count > max_points else 1
        peak = a + int(np.argmax(running["active"][a:b]))
        keep.extend(sorted({*range(a, b, step), peak, b - 1}))
    at = np.array(keep, np.int64)
    series = _rows(inp, ev["_row"].to_numpy()[at]).with_columns(
        pl.Series("i", at, pl.UInt32), ev["device"].gather(at),
        *(pl.Series(f"{k}_bytes", running[k][at]) for k in _KINDS)).select(_SERIES)
    allocs = code == _CODE["alloc"]
    by_stack = (ev.select("stack_id", "size").filter(pl.Series(allocs))
                .with_columns(retained=pl.Series(retained[allocs]))
                .group_by("stack_id").agg(
                    pl.len().alias("allocs"), pl.col("size").sum().alias("alloc_bytes"),
                    pl.col("retained").sum().alias("retained_count"),
                    pl.col("size").filter(pl.col("retained")).sum().alias("retained_bytes")))
    return Replayed(n, devices, list(series.iter_rows(named=True)), by_stack)
