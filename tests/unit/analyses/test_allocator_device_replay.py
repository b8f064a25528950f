"""The allocator replay over whole columns (allocator/device_replay.py) against the whole
replay (allocator/replay.py `entries`, every column of every entry), on a SYNTHETIC snapshot
built here: two devices, each with two 8 MiB segments made at the start and a third
made and released mid-way, allocations of sizes that are not multiples of 512 bytes
at reused addresses, most freed, some kept to the end (their blocks in the snapshot,
rounded up). The reference is computed by the whole replay and the sampling rule of
the series written out here."""

from __future__ import annotations

import dataclasses
import json
import pickle
import random
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from gputrace.analyses.allocator.device_replay import replay_devices
from gputrace.analyses.allocator.growth import growth
from gputrace.analyses.allocator.replay import entries, paired_allocs, per_device
from gputrace.analyses.helpers.inputs import Inputs, inputs_from_trace
from gputrace.importers.torch_snapshot import read_snapshot, write_alone
from gputrace.trace.reader import open_trace

MiB = 1 << 20
SEG = 8 * MiB
MAX_POINTS = 9


def _snapshot(seed: int) -> dict[str, Any]:
    rnd = random.Random(seed)
    stacks = [[{"name": f"f{s}", "filename": f"/home/u/p/m{s}.py", "line": 3 + s}]
              for s in range(4)]
    segments: list[dict[str, Any]] = []
    traces: list[list[dict[str, Any]]] = []
    t = 1_767_225_600_000_000
    for dev in range(2):
        base = 0x7F00_0000_0000 + dev * 0x100_0000_0000
        tr: list[dict[str, Any]] = []
        for k in range(2):
            t += 1
            tr.append({"action": "segment_alloc", "addr": base + k * SEG, "size": SEG,
                       "stream": 0, "time_us": t, "frames": stacks[0]})
        slots = [base + k * SEG + j * MiB for k in range(2) for j in range(8)]
        kept: dict[int, int] = {}
        for i in range(60 + 25 * dev):
            t += 2
            if i == 20:  # a segment made and released mid-way, not in the snapshot
                extra = base + 4 * SEG
                tr.append({"action": "segment_alloc", "addr": extra, "size": SEG,
                           "stream": 0, "time_us": t, "frames": stacks[1]})
                tr.append({"action": "segment_free", "addr": extra, "size": SEG,
                           "stream": 0, "time_us": t + 1, "frames": stacks[1]})
            free = [a for a in slots if a not in kept]
            addr = rnd.choice(free)
            req = MiB - rnd.randrange(1, 4000)
            fr = stacks[rnd.randrange(4)]
            tr.append({"action": "alloc", "addr": addr, "size": req, "stream": 0,
                       "time_us": t, "frames": fr})
            if rnd.random() < 0.15 and len(kept) < 6:
                kept[addr] = req
            else:
                for a in ("free_requested", "free_completed"):
                    tr.append({"action": a, "addr": addr, "size": req, "stream": 0,
                               "time_us": t + 1, "frames": fr})
        traces.append(tr)
        for k in range(2):
            s = base + k * SEG
            blocks = [{"address": s + j * MiB, "size": MiB,
                       "requested_size": kept.get(s + j * MiB, 0),
                       "state": "active_allocated" if s + j * MiB in kept else "inactive",
                       "frames": stacks[0]} for j in range(8)]
            alloc = sum(b["size"] for b in blocks if b["state"] != "inactive")
            segments.append({"device": dev, "address": s, "total_size": SEG,
                             "allocated_size": alloc, "active_size": alloc,
                             "requested_size": sum(b["requested_size"] for b in blocks),
                             "stream": 0, "segment_type": "large",
                             "segment_pool_id": (0, 0), "is_expandable": False,
                             "frames": [], "blocks": blocks})
    return {"segments": segments, "device_traces": traces, "allocator_settings": {}}


@pytest.fixture(scope="module")
def inp(tmp_path_factory: pytest.TempPathFactory) -> Inputs:
    tmp = tmp_path_factory.mktemp("stream")
    snap = tmp / "s.pickle"
    snap.write_bytes(pickle.dumps(_snapshot(7)))
    return inputs_from_trace(open_trace(write_alone(read_snapshot(snap), tmp / "t")))


def _reference(inp: Inputs) -> tuple[int, list[dict[str, Any]], list[dict[str, Any]],
                                     dict[Any, tuple[int, int, int, int]]]:
    """The whole replay: per device, the series sampled as growth's docstring says
    (every k-th entry of a device, its first peak of active bytes, its last), and
    per stack (allocs, bytes, retained allocs, retained bytes) from the pairing."""
    rep = entries(inp, pools=False).collect().sort("i")
    series: list[dict[str, Any]] = []
    for _, d in rep.group_by(["device"], maintain_order=True):
        n = d.height
        keep = set(range(n))
        if n > MAX_POINTS:
            step = -(-n // MAX_POINTS)
            act = d["active_bytes"].to_list()
            keep = {*range(0, n, step), act.index(max(act)), n - 1}
        series.extend(d.select("ts_ns", "i", "device", "seq", "action", "active_bytes",
                               "requested_bytes", "reserved_bytes").row(k, named=True)
                      for k in sorted(keep))
    stacks: dict[Any, list[int]] = {}
    for r in paired_allocs(rep.lazy()).collect().iter_rows(named=True):
        s = stacks.setdefault(r["stack_id"], [0, 0, 0, 0])
        s[0] += 1
        s[1] += r["size"]
        if r["free_i"] is None:
            s[2] += 1
            s[3] += r["size"]
    return rep.height, per_device(rep), series, {k: tuple(v) for k, v in stacks.items()}


def _stacks(df: pl.DataFrame) -> dict[Any, tuple[int, ...]]:
    return {r["stack_id"]: (r["allocs"], r["alloc_bytes"], r["retained_count"],
                            r["retained_bytes"]) for r in df.iter_rows(named=True)}


def test_column_replay_equals_the_whole_one(inp: Inputs) -> None:
    n, devices, series, stacks = _reference(inp)
    got = replay_devices(inp, MAX_POINTS)
    assert n > 3 * 50 and len(devices) == 2
    assert got.entries == n
    assert got.devices == devices
    assert got.series == series
    assert _stacks(got.by_stack) == stacks
    # the scenario is what the docstring says: kept blocks, a segment made and freed
    assert any(v[2] for v in stacks.values())
    assert all(d["peak_reserved_bytes"] == 3 * SEG for d in devices)


def test_growth_report_reads_the_replay(inp: Inputs) -> None:
    """growth's headline is the device whose reserved bytes peaked highest, its
    figures the replay's."""
    _, devices, _, _ = _reference(inp)
    data = growth(inp).data
    head = max(devices, key=lambda d: (d["peak_reserved_bytes"], d["peak_active_bytes"]))
    assert data["device"] == head["device"]
    assert data["peak_active_bytes"] == head["peak_active_bytes"]
    assert data["growth_bytes"] == head["end_active_bytes"] - head["start_active_bytes"]
    assert json.dumps(data) == json.dumps(growth(inp).data)


def test_rows_out_of_order_are_sorted_first(inp: Inputs) -> None:
    """A table not in (device, seq) order (not as the importer writes it) is sorted
    first: the figures stay the whole replay's, the series rows their own."""
    ev = inp.scan("allocator_events").collect()
    shuffled = ev.sample(fraction=1.0, shuffle=True, seed=3)
    assert not shuffled.equals(ev)
    other = dataclasses.replace(inp, tables={**inp.tables,
                                             "allocator_events": shuffled.lazy()})
    n, devices, series, stacks = _reference(inp)
    got = replay_devices(other, MAX_POINTS)
    assert (got.entries, got.devices, got.series) == (n, devices, series)
    assert _stacks(got.by_stack) == stacks


def test_empty_history(tmp_path: Path) -> None:
    """An empty history: no entries, no devices."""
    snap = tmp_path / "s.pickle"
    data = _snapshot(1)
    data["device_traces"] = [[], []]
    snap.write_bytes(pickle.dumps(data))
    empty = inputs_from_trace(open_trace(write_alone(read_snapshot(snap), tmp_path / "t")))
    got = replay_devices(empty, MAX_POINTS)
    assert (got.entries, got.devices, got.series, got.by_stack.height) == (0, [], [], 0)
