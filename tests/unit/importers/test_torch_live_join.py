"""A snapshot imported `--into` a recording whose allocator layer ran live: the live
rows are kept, the snapshot's added as parts of their own, the analyses read one source
(the snapshot by default, saying so), and the import says how the two agree.

Both sides are synthetic (never from PyTorch or a GPU): the live side is a TraceBuilder
recording whose allocator rows are made by the torch_allocator layer's own decoder
(record/torch_allocator/decode.py) from planted events, the snapshot a plain-dict
pickle of the same process taken at t = 6 s. The truth, by hand:

- segment A (20 MiB) from t = 1 s; a train() tensor of 8 MiB - 100 bytes at A from
  t = 1 s, alive at the end in both: matched.
- a 4 MiB tensor at A + 8 MiB, allocated at 2 s and freed at 3 s: in neither.
- a 2 MiB tensor at A + 12 MiB from 5.5 s, freed at 8 s (after the snapshot): only in
  the snapshot.
- a 1 MiB tensor at A + 16 MiB from 7 s (after the snapshot): only live.

Bytes in tensors at the end, device 0: live 8 MiB (8 MiB - 100 rounded up to 512 B)
+ 1 MiB = 9 MiB; snapshot 8 MiB + 2 MiB = 10 MiB.
"""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from gputrace import cli
from gputrace.analyses.allocator.lineup import line_up_sources
from gputrace.analyses.allocator.tensors import alive_blocks
from gputrace.analyses.helpers.inputs import allocator_sources, inputs_from_trace
from gputrace.importers.torch_join import write_joined
from gputrace.importers.torch_snapshot import read_snapshot
from gputrace.record.torch_allocator.decode import TORCH_DTYPE, AllocatorState
from gputrace.trace.builder import TraceBuilder, ns
from gputrace.trace.reader import open_trace

MiB = 1 << 20
T_US = 1_767_225_600_000_000  # the builder's wall clock at t = 0 (TraceBuilder.manifest)
SEG_A = 0x7F00_0000_0000
PID = 4242
KIND = {"alloc": 0, "free": 1, "seg_alloc": 2}
TRAIN = [{"name": "train", "filename": "t.py", "line": 10}]
EVAL = [{"name": "evaluate", "filename": "t.py", "line": 20}]
LIVE_STACK = 7  # the live layer's native stack id of every planted event


def _event(t: float, kind: str, ptr: int, size: int) -> tuple[Any, ...]:
    # ts, latency, ptr, size, stream, request, pid, tid, stack, py stack, result, device
    return (ns(t), 0, ptr, size, 0, size, PID, PID, LIVE_STACK, -1, 0, 0, KIND[kind], 0)


def live_recording(tmp_path: Path, api: bool = True) -> Path:
    """The live side: api and allocator layers over 0..10 s, rows as the layer writes."""
    b = TraceBuilder(("syscall", *(("api",) if api else ()), "allocator"), duration_s=10.0)
    b.process(PID, "python")
    if api:
        b.cuda_alloc(1.0, PID, 20 * MiB, ptr=SEG_A)
    state = AllocatorState(realtime_offset_ns=b.manifest()["clock"]["realtime_offset_ns"])
    ev = np.array([
        _event(1.0, "seg_alloc", SEG_A, 20 * MiB),
        _event(1.0, "alloc", SEG_A, 8 * MiB - 100),
        _event(2.0, "alloc", SEG_A + 8 * MiB, 4 * MiB),
        _event(3.0, "free", SEG_A + 8 * MiB, 0),
        _event(5.5, "alloc", SEG_A + 12 * MiB, 2 * MiB),
        _event(7.0, "alloc", SEG_A + 16 * MiB, 1 * MiB),
        _event(8.0, "free", SEG_A + 12 * MiB, 0),
    ], dtype=TORCH_DTYPE)
    rows = state.rows(ev, {(PID, LIVE_STACK): 1})
    assert rows is not None
    for name, t in {"allocator_events": rows, **state.state_tables()}.items():
        for r in t.to_pylist():
            b.row(name, **r)
    b.row("allocator_frames", stack_id=1, depth=0, function="live_fn", filename="l.py",
          line=3)
    return b.build(tmp_path / "rec")


def _e(action: str, t_s: float, size: int, addr: int, frames: list[Any]) -> dict[str, Any]:
    return {"action": action, "size": size, "stream": 0, "addr": addr, "frames": frames,
            "time_us": T_US + round(t_s * 1e6)}


def snapshot(tmp_path: Path) -> Path:
    """The program's own snapshot at t = 6 s (synthetic plain dicts)."""
    blocks = [(SEG_A, 8 * MiB, 8 * MiB - 100, "active_allocated", TRAIN),
              (SEG_A + 8 * MiB, 4 * MiB, 4 * MiB, "inactive", []),
              (SEG_A + 12 * MiB, 2 * MiB, 2 * MiB, "active_allocated", EVAL),
              (SEG_A + 14 * MiB, 6 * MiB, 0, "inactive", [])]
    snap = {
        "segments": [{
            "device": 0, "address": SEG_A, "total_size": 20 * MiB,
            "allocated_size": 10 * MiB, "active_size": 10 * MiB,
            "requested_size": 10 * MiB - 100, "stream": 0, "segment_type": "large",
            "segment_pool_id": (0, 0), "is_expandable": False, "frames": TRAIN,
            "blocks": [{"address": a, "size": s, "requested_size": r, "state": st,
                        "frames": f} for a, s, r, st, f in blocks]}],
        "device_traces": [[
            _e("segment_alloc", 1.0, 20 * MiB, SEG_A, TRAIN),
            _e("alloc", 1.0, 8 * MiB, SEG_A, TRAIN),
            _e("alloc", 2.0, 4 * MiB, SEG_A + 8 * MiB, EVAL),
            _e("free_requested", 3.0, 4 * MiB, SEG_A + 8 * MiB, EVAL),
            _e("free_completed", 3.0, 4 * MiB, SEG_A + 8 * MiB, EVAL),
            _e("alloc", 5.5, 2 * MiB, SEG_A + 12 * MiB, EVAL)]],
        "allocator_settings": {}, "external_annotations": [],
    }
    f = tmp_path / "snap.pickle.gz"
    with gzip.open(f, "wb") as g:
        pickle.dump(snap, g)
    return f


def test_live_rows_kept_and_snapshot_added(tmp_path: Path) -> None:
    rec = live_recording(tmp_path)
    out, join = write_joined(read_snapshot(snapshot(tmp_path)), rec, tmp_path / "j")
    assert join.live and join.pid == PID
    t = open_trace(out)
    assert t.layers == ["syscall", "api", "allocator"]
    both = allocator_sources(t)
    assert both is not None
    live_ev = both["live"]["allocator_events"].collect()
    assert live_ev.equals(open_trace(rec).scan("allocator_events").collect())
    snap_ev = both["snapshot"]["allocator_events"].collect()
    assert snap_ev["action"].to_list() == ["segment_alloc", "alloc", "alloc",
                                           "free_requested", "free_completed", "alloc"]
    # the snapshot's stacks moved past the live layer's (1): train 2, evaluate 3
    assert snap_ev["stack_id"].to_list() == [2, 2, 3, 3, 3, 3]
    frames = t.scan("allocator_frames").sort("stack_id").collect()
    assert frames.select("stack_id", "function").rows() == [
        (1, "live_fn"), (2, "train"), (3, "evaluate")]


@pytest.mark.parametrize("api", [True, False])
def test_lineup_per_device(tmp_path: Path, api: bool) -> None:
    """Without the API layer the segments join to the live layer's segment_alloc rows."""
    out, join = write_joined(read_snapshot(snapshot(tmp_path)),
                             live_recording(tmp_path, api), tmp_path / "j")
    assert join.pid == PID and join.api_ts == {SEG_A: ns(1.0)}
    both = allocator_sources(open_trace(out))
    assert both is not None
    got = line_up_sources(both["live"]["allocator_blocks"],
                          both["snapshot"]["allocator_blocks"])
    assert got.rows() == [(0, 9 * MiB, 10 * MiB, 1, 1, 1)]


def test_analyses_read_one_source(tmp_path: Path) -> None:
    out, _ = write_joined(read_snapshot(snapshot(tmp_path)), live_recording(tmp_path),
                          tmp_path / "j")
    for pick, addrs in (("snapshot", {SEG_A, SEG_A + 12 * MiB}),
                        ("live", {SEG_A, SEG_A + 16 * MiB})):
        inp = inputs_from_trace(open_trace(out), None if pick == "snapshot" else pick)
        alive = alive_blocks(inp).collect()
        assert set(alive["address"]) == addrs, pick
        other = "live" if pick == "snapshot" else "snapshot"
        assert any(f"read the {pick} rows; the {other} rows are not counted" in p
                   for p in inp.problems)
    # a trace with one source carries no such warning
    alone = inputs_from_trace(open_trace(live_recording(tmp_path / "x")))
    assert not any("caching allocator twice" in p for p in alone.problems)
    assert alive_blocks(alone).select(pl.len()).collect().item() == 2


def test_cli_result_line_and_second_import_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rec, snap = live_recording(tmp_path), snapshot(tmp_path)
    rc = cli.main(["import", "torch-snapshot", str(snap), "--into", str(rec),
                   "-o", str(tmp_path / "j")])
    out = capsys.readouterr().out
    assert rc == 0
    assert ("device 0: tensors at the end 9,437,184 B live, 10,485,760 B in the snapshot; "
            "1 matched by address and size, 1 only live, 1 only in the snapshot") in out, out
    rc = cli.main(["import", "torch-snapshot", str(snap), "--into", str(tmp_path / "j"),
                   "-o", str(tmp_path / "k")])
    err = capsys.readouterr().err
    assert rc == 1 and "already holds an imported allocator layer" in err, err
    assert err.count("\n") == 1
