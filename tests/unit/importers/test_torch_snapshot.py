"""`gputrace import torch-snapshot`: PyTorch caching-allocator snapshots as the allocator
layer. Guards: a hostile pickle never runs (refused in one line, naming the global);
damaged files, wrong shapes and missing keys are one line, no traceback; the real H200
snapshot's truth (fixtures/real-h200-torch) comes out of the tables and the reports;
a synthetic planted history comes out exactly; `--into` joins by address and clock,
and refuses a snapshot that does not line up."""

from __future__ import annotations

import gzip
import lzma
import os
import pickle
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from gputrace import cli
from gputrace.importers import safe_pickle
from gputrace.importers.safe_pickle import PickleRefused, load_plain
from gputrace.importers.torch_join import write_joined
from gputrace.importers.torch_snapshot import read_snapshot, write_alone
from gputrace.trace.builder import TraceBuilder
from gputrace.trace.reader import open_trace
from tests.analyze_helpers import analyze
from tests.conftest import ROOT

REAL = ROOT / "fixtures" / "real-h200-torch" / "torch-workload.snapshot.pickle.xz"
MiB = 1 << 20
# the site: the first frame of the user's code, its file by base name (helpers/sites.py)
LINE64 = "main (torch_workload.py:64)"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = cli.main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


def table(trace: Path, name: str) -> pl.DataFrame:
    return open_trace(trace).scan(name).collect()


# ------------------------------------------------------------------ hostile pickles


class _Reduce:
    """Pickles as a call of `fn(*args)` (what an attacker writes by hand)."""

    def __init__(self, fn: Any, *args: Any) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.fn, self.args)


def _hostile(marker: Path) -> dict[str, bytes]:
    cmd = f"touch {marker}"
    code = f"open({str(marker)!r}, 'w')"
    out = {}
    for proto in (0, 2, 4):
        out[f"reduce-os.system-p{proto}"] = pickle.dumps(_Reduce(os.system, cmd), proto)
        out[f"reduce-eval-p{proto}"] = pickle.dumps(_Reduce(eval, code), proto)
        # a global deep inside plain data, as a snapshot's segments list
        out[f"nested-global-p{proto}"] = pickle.dumps(
            {"segments": [{"frames": [os.system]}], "device_traces": []}, proto)
    # hand-written opcodes: INST (protocol 0 `i`), a persistent id, GLOBAL + REDUCE
    out["inst"] = b"(S'" + cmd.encode() + b"'\nios\nsystem\n."
    out["persid"] = b"\x80\x02X\x01\x00\x00\x00aQ."
    out["global-reduce"] = b"cos\nsystem\n(S'" + cmd.encode() + b"'\ntR."
    return out


def test_hostile_pickles_are_refused_and_nothing_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    for name, data in _hostile(marker).items():
        for suffix, wrap in (("", bytes), (".xz", lzma.compress), (".gz", gzip.compress)):
            f = tmp_path / f"{name}.pickle{suffix}"
            f.write_bytes(wrap(data))
            with pytest.raises(PickleRefused) as e:
                load_plain(f)
            msg = str(e.value)
            assert msg.startswith("refused:") and "\n" not in msg, (name, msg)
            assert "only plain data" in msg
            if name != "persid":
                assert ("system" in msg or "builtin__.eval" in msg or "builtins.eval" in msg), msg
            assert not marker.exists(), f"{name}{suffix} ran code"


def test_hostile_pickle_cli_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "ran"
    f = tmp_path / "evil.pickle"
    f.write_bytes(pickle.dumps(_Reduce(os.system, f"touch {marker}")))
    rc, _, err = run(capsys, "import", "torch-snapshot", str(f), "-o", str(tmp_path / "t"))
    assert rc == 1 and not marker.exists()
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("gputrace: error: refused: the snapshot names the global posix.system")
    assert not (tmp_path / "t").exists()


def _snap(**over: Any) -> dict[str, Any]:
    return {"segments": [], "device_traces": [], **over}


@pytest.mark.parametrize(("data", "expect"), [
    (lzma.compress(pickle.dumps(_snap()))[:-20], "truncated or damaged"),
    (pickle.dumps(_snap())[:-5], "truncated or damaged"),
    (b"\xfd7zXZ\x00garbage", "truncated or damaged"),
    (b"not a pickle at all", "not a readable pickle"),
    (b"", "truncated or damaged"),
    (pickle.dumps([{"address": 1}]), "segments[0] lacks 'device'"),
    (pickle.dumps(42), "holds int, not a PyTorch memory snapshot"),
    (pickle.dumps({"device_traces": []}), "lacks 'segments'"),
    (pickle.dumps(_snap(segments=[{"device": 0}])), "segments[0] lacks 'address'"),
    (pickle.dumps(_snap(segments=[{"device": 0, "address": -1}])),
     "segments[0].address = -1 is out of range"),
    (pickle.dumps(_snap(device_traces=[[{"action": "rm -rf", "time_us": 1}]])),
     "device_traces[0][0].action is 'rm -rf', not a trace entry action"),
    (pickle.dumps(_snap(device_traces=[[{"action": "alloc", "addr": "x", "time_us": 1}]])),
     "device_traces[0][0].addr is str, not an integer"),
], ids=["xz-truncated", "pickle-truncated", "xz-garbage", "text", "empty", "segment-list", "int",
        "no-segments", "no-address", "negative", "bad-action", "str-addr"])
def test_bad_files_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                data: bytes, expect: str) -> None:
    f = tmp_path / "s.pickle"
    f.write_bytes(data)
    rc, _, err = run(capsys, "import", "torch-snapshot", str(f), "-o", str(tmp_path / "t"))
    assert rc == 1, err
    assert expect in err and err.count("\n") == 1 and "Traceback" not in err, err


def test_compressed_files_are_streamed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading decompresses as the unpickler reads: the whole-buffer calls that would hold
    a several-GiB snapshot twice are never made."""
    def whole(*_: Any, **__: Any) -> Any:
        raise AssertionError("read the whole file into memory")

    monkeypatch.setattr(safe_pickle.lzma, "decompress", whole)
    monkeypatch.setattr(safe_pickle.gzip, "decompress", whole)
    monkeypatch.setattr(safe_pickle.pickle, "loads", whole)
    assert len(load_plain(REAL).value["segments"]) == 9


# ------------------------------------------------------------------ the real snapshot


def test_real_snapshot_inspected_with_the_restricted_unpickler() -> None:
    """What the fixture holds, read by our unpickler (the numbers the other tests use)."""
    got = load_plain(REAL)
    assert got.sha256 == "8bf40015564cb0c34849f25d9338b2a68b8010b8b2f04ea0a63040ffa548a179"
    assert got.bytes == 3688 and got.compression == "xz"
    snap = got.value
    segs = snap["segments"]
    assert sorted(s["total_size"] for s in segs) == [
        2 * MiB, 16 * MiB, 20 * MiB, 32 * MiB, 40 * MiB, 40 * MiB, 40 * MiB, 40 * MiB, 40 * MiB]
    assert sum(s["total_size"] for s in segs) == 283_115_520
    assert sum(s["allocated_size"] for s in segs) == 201_326_592
    assert len(snap["device_traces"]) == 1 and len(snap["device_traces"][0]) == 500


def test_real_snapshot_tables(tmp_path: Path) -> None:
    out = write_alone(read_snapshot(REAL), tmp_path / "t")
    segs = table(out, "allocator_segments")
    assert segs.height == 9 and segs["total_size_bytes"].sum() == 283_115_520
    assert segs["pool"].value_counts().sort("pool").rows() == [("large", 8), ("small", 1)]
    blocks = table(out, "allocator_blocks")
    alive = blocks.filter(pl.col("state") == "active_allocated")
    assert blocks.height == 18 and alive.height == 11
    assert alive["size_bytes"].sum() == 201_326_592
    frames = table(out, "allocator_frames")
    top = frames.filter(pl.col("depth") == 0).select("stack_id", "function", "filename", "line")
    sixteen = alive.filter(pl.col("size_bytes") == 16 * MiB).join(top, on="stack_id")
    assert sixteen.height == 10 and set(sixteen["line"]) == {64}
    assert set(sixteen["filename"]) == {"/work/steering/gpukit/workloads/torch_workload.py"}
    ev = table(out, "allocator_events")
    assert ev.height == 500 and ev["seq"].to_list() == list(range(500))
    assert dict(ev["action"].value_counts().rows()) == {
        "alloc": 171, "free_requested": 160, "free_completed": 160, "segment_alloc": 9}
    assert (ev["ts_ns"] == ev["time_us"] * 1000).all()  # alone: Unix-epoch ns
    assert frames["stack_id"].n_unique() == 9
    m = open_trace(out).manifest
    assert m["layers"] == ["allocator"] and m["clock"]["source"] == "unix-epoch"
    imp = m["imported"][0]
    assert imp["kind"] == "torch-snapshot" and imp["file"] == REAL.name
    assert imp["sha256"].startswith("8bf40015") and imp["joined"] is False


def test_real_snapshot_reports(tmp_path: Path) -> None:
    out = write_alone(read_snapshot(REAL), tmp_path / "t")
    doc = analyze(out)
    t = doc["tensors"]
    assert (t["total_count"], t["total_bytes"]) == (11, 201_326_592)
    first = t["by_stack"][0]
    assert (first["count"], first["bytes"], first["top_frame"]) == (10, 160 * MiB, LINE64)
    assert t["by_stack"][1]["bytes"] == 32 * MiB and t["by_stack"][1]["top_frame"].endswith(":69)")
    p = doc["allocator_pool"]
    assert (p["reserved_bytes"], p["allocated_bytes"]) == (283_115_520, 201_326_592)
    assert p["reserved_unallocated_bytes"] == 81_788_928
    assert p["largest_inactive_bytes"] == 40 * MiB and p["segment_count"] == 9
    large = next(x for x in p["pools"] if x["pool"] == "large")
    assert (large["segments"], large["reserved_bytes"], large["inactive_bytes"]) == (
        8, 281_018_368, 76 * MiB)
    assert large["fragmentation"] == pytest.approx(1 - 40 / 76, abs=1e-6)
    g = doc["allocator_growth"]
    # the history is complete: replayed back from the snapshot it starts at zero
    assert (g["start_active_bytes"], g["start_reserved_bytes"]) == (0, 0)
    assert g["end_active_bytes"] == 201_326_592 and g["end_reserved_bytes"] == 283_115_520
    # the trace's sizes are requests; active bytes are blocks (requests rounded to 512)
    assert g["entries"] == 500 and g["peak_requested_bytes"] == 255_323_132
    assert g["peak_active_bytes"] == 255_326_208
    leak = g["by_stack"][0]
    assert leak["top_frame"] == LINE64
    assert (leak["allocs"], leak["retained_count"]) == (10, 10)
    assert leak["retained_bytes_per_alloc"] == 16 * MiB  # the planted 16 MiB per iteration
    assert doc["leaks"]["recorded"] is False  # no API layer in an import alone


def test_real_snapshot_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "t")
    rc, text, err = run(capsys, "import", "torch-snapshot", str(REAL), "-o", out)
    assert rc == 0, err
    assert "9 segments, 18 blocks, 500 trace entries, 9 stacks" in text
    rc, text, err = run(capsys, "info", out)
    assert rc == 0 and "imported   torch-snapshot torch-workload.snapshot.pickle.xz" in text
    rc, text, err = run(capsys, "analyze", out, "--only", "tensors,allocator-growth")
    assert rc == 0, err
    assert "alive: 11 tensors, 192.0 MiB from 2 stacks" in text
    assert "160.0 MiB" in text and "torch_workload.py:64" in text


# ------------------------------------------------------------------ synthetic history

T_US = 1_767_225_600_000_000  # the builder's wall clock at t = 0 (TraceBuilder.manifest)
SEG_A, SEG_B = 0x7F00_0000_0000, 0x7F00_0400_0000
F_TRAIN = [{"name": "train", "filename": "t.py", "line": 10},
           {"name": "<module>", "filename": "t.py", "line": 50}]
F_EVAL = [{"name": "evaluate", "filename": "t.py", "line": 20}]


def _e(action: str, t_s: float, size: int, addr: int | None = None,
       frames: list[dict[str, Any]] | None = None, **more: Any) -> dict[str, Any]:
    e: dict[str, Any] = {"action": action, "size": size, "stream": 0,
                         "time_us": T_US + round(t_s * 1e6), **more}
    if addr is not None:
        e["addr"] = addr
    if frames is not None:
        e["frames"] = frames
    return e


def synthetic() -> dict[str, Any]:
    """A synthetic snapshot (plain dicts, never from PyTorch): segment A (20 MiB) holds a
    leaked 8 MiB tensor from train(); a 4 MiB tensor from evaluate() was freed; segment
    B (2 MiB) was allocated and freed; one 1 GiB request ran out of memory."""
    return {
        "segments": [{
            "device": 0, "address": SEG_A, "total_size": 20 * MiB, "allocated_size": 8 * MiB,
            "active_size": 8 * MiB, "requested_size": 8 * MiB - 100, "stream": 0,
            "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
            "frames": F_TRAIN,
            "blocks": [
                {"address": SEG_A, "size": 8 * MiB, "requested_size": 8 * MiB - 100,
                 "state": "active_allocated", "frames": F_TRAIN},
                {"address": SEG_A + 8 * MiB, "size": 12 * MiB, "requested_size": 4 * MiB,
                 "state": "inactive", "frames": []}]}],
        "device_traces": [[
            _e("segment_alloc", 1.0, 20 * MiB, SEG_A, F_TRAIN),
            _e("alloc", 1.0, 8 * MiB, SEG_A, F_TRAIN),
            _e("alloc", 2.0, 4 * MiB, SEG_A + 8 * MiB, F_EVAL),
            _e("free_requested", 3.0, 4 * MiB, SEG_A + 8 * MiB, F_EVAL),
            _e("free_completed", 3.5, 4 * MiB, SEG_A + 8 * MiB, F_EVAL),
            _e("segment_alloc", 4.0, 2 * MiB, SEG_B),
            _e("segment_free", 5.0, 2 * MiB, SEG_B),
            _e("oom", 6.0, 1 << 30, None, F_EVAL, device_free=3 * MiB),
        ]],
        "allocator_settings": {}, "external_annotations": [],
    }


def _write(tmp_path: Path, snap: dict[str, Any], name: str = "syn.pickle.gz") -> Path:
    f = tmp_path / name
    with gzip.open(f, "wb") as g:
        pickle.dump(snap, g)
    return f


def test_synthetic_history_exact(tmp_path: Path) -> None:
    out = write_alone(read_snapshot(_write(tmp_path, synthetic())), tmp_path / "t")
    ev = table(out, "allocator_events")
    cols = ["seq", "action", "address", "size_bytes", "device_free_bytes", "stack_id"]
    assert ev.select(cols).rows() == [
        (0, "segment_alloc", SEG_A, 20 * MiB, None, 1),
        (1, "alloc", SEG_A, 8 * MiB, None, 1),
        (2, "alloc", SEG_A + 8 * MiB, 4 * MiB, None, 2),
        (3, "free_requested", SEG_A + 8 * MiB, 4 * MiB, None, 2),
        (4, "free_completed", SEG_A + 8 * MiB, 4 * MiB, None, 2),
        (5, "segment_alloc", SEG_B, 2 * MiB, None, None),
        (6, "segment_free", SEG_B, 2 * MiB, None, None),
        (7, "oom", None, 1 << 30, 3 * MiB, 2),
    ]
    assert ev["action_code"].to_list() == [3, 0, 0, 1, 2, 3, 4, 8]
    assert ev["ts_ns"].to_list() == [(T_US + s) * 1000 for s in (
        1_000_000, 1_000_000, 2_000_000, 3_000_000, 3_500_000, 4_000_000, 5_000_000, 6_000_000)]
    assert table(out, "allocator_frames").select(
        "stack_id", "depth", "function", "filename", "line").rows() == [
        (1, 0, "train", "t.py", 10), (1, 1, "<module>", "t.py", 50),
        (2, 0, "evaluate", "t.py", 20)]
    assert table(out, "allocator_blocks").select(
        "segment_address", "address", "size_bytes", "state", "stack_id").rows() == [
        (SEG_A, SEG_A, 8 * MiB, "active_allocated", 1),
        (SEG_A, SEG_A + 8 * MiB, 12 * MiB, "inactive", None)]
    assert table(out, "allocator_segments").select("pool_id", "is_expandable").rows() == [
        ("0,0", False)]
    doc = analyze(out)
    g = doc["allocator_growth"]
    assert (g["start_active_bytes"], g["end_active_bytes"], g["peak_active_bytes"]) == (
        0, 8 * MiB, 12 * MiB)
    assert (g["start_reserved_bytes"], g["end_reserved_bytes"]) == (0, 20 * MiB)
    assert [(s["top_frame"], s["allocs"], s["retained_bytes"]) for s in g["by_stack"]] == [
        ("train (t.py:10)", 1, 8 * MiB), ("evaluate (t.py:20)", 1, 0)]
    p = doc["allocator_pool"]
    assert (p["reserved_unallocated_bytes"], p["largest_inactive_bytes"]) == (12 * MiB, 12 * MiB)
    assert p["fragmentation"] == 0
    assert doc["tensors"]["by_stack"][0]["frames"] == ["train (t.py:10)", "<module> (t.py:50)"]


# ------------------------------------------------------------------ --into


def _recording(tmp_path: Path, *, ptr: int = SEG_A, layers: tuple[str, ...] = (
        "syscall", "api")) -> Path:
    """A synthetic recording of pid 4242 over 0..10 s whose cuMemAlloc at 0.9 s returned
    segment A's address (and one of another process elsewhere)."""
    b = TraceBuilder(layers, duration_s=10.0)
    b.process(4242, "python")
    b.cuda_alloc(0.9, 4242, 20 * MiB, ptr=ptr)
    b.cuda_alloc(0.5, 77, 1 * MiB, ptr=0x1000)
    return b.build(tmp_path / "rec")


def test_into_joins_by_address_and_clock(tmp_path: Path) -> None:
    rec = _recording(tmp_path)
    out, join = write_joined(read_snapshot(_write(tmp_path, synthetic())), rec, tmp_path / "j")
    assert join.pid == 4242 and join.api_ts == {SEG_A: 1_000_000_000_000 + 900_000_000}
    t = open_trace(out)
    assert t.layers == ["syscall", "api", "allocator"]
    offset = t.manifest["clock"]["realtime_offset_ns"]
    ev = t.scan("allocator_events").collect()
    assert (ev["ts_ns"] == ev["time_us"] * 1000 - offset).all()
    assert ev["ts_ns"][1] == 1_000_000_000_000 + 1_000_000_000  # alloc at t = 1 s
    assert set(ev["pid"]) == {4242}
    segs = t.scan("allocator_segments").collect()
    assert segs["api_alloc_ts_ns"].to_list() == [1_000_000_000_000 + 900_000_000]
    assert t.scan("cuda_calls").collect().equals(open_trace(rec).scan("cuda_calls").collect())
    imp = t.manifest["imported"][0]
    assert imp["joined"] is True and imp["pid"] == 4242 and imp["segments_matched"] == 1
    doc = analyze(out)
    assert doc["tensors"]["by_stack"][0]["pid"] == 4242 and doc["leaks"]["recorded"]


@pytest.mark.parametrize(("case", "expect"), [
    ("address", "none of the snapshot's 1 segment addresses was returned by a cuMemAlloc"),
    ("time", "fall outside the recording"),
    ("no-api", "has no API layer"),
])
def test_into_refuses_what_does_not_line_up(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            case: str, expect: str) -> None:
    snap = synthetic()
    if case == "time":  # the same addresses, an hour later
        for e in snap["device_traces"][0]:
            e["time_us"] += 3600 * 10**6
    rec = _recording(tmp_path, ptr=0xDEAD000 if case == "address" else SEG_A,
                     layers=("syscall",) if case == "no-api" else ("syscall", "api"))
    f = _write(tmp_path, snap)
    rc, _, err = run(capsys, "import", "torch-snapshot", str(f), "--into", str(rec),
                     "-o", str(tmp_path / "j"))
    assert rc == 1 and expect in err and err.count("\n") == 1, err
    assert err.startswith("gputrace: error: refused: ")
    assert not (tmp_path / "j").exists()


def test_into_the_real_recording_is_refused(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """The real snapshot and the real CUDA recording are different processes."""
    rc, _, err = run(capsys, "import", "torch-snapshot", str(REAL), "--into",
                     str(ROOT / "fixtures" / "real-h200-cuda"), "-o",
                     str(tmp_path / "j"))
    assert rc == 1 and "none of the snapshot's 9 segment addresses" in err, err
