"""The streaming snapshot reader (pickle_stream + torch_stream) against the reference
reader (the whole pickle unpickled by `PlainUnpickler`, then walked: read_snapshot's
`stream=False`): the same four tables, notes and errors on every fixture, on the real
snapshots, on long synthetic histories (where most entries take the byte-pattern
path, FRAME opcodes fall inside entries and the pickle is read in several buffers),
and on odd and hostile pickles. Plus what only the stream reader does: bounded memory,
and a tuple key refused before it is hashed."""

from __future__ import annotations

import pickle
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gputrace.importers import torch_scan
from gputrace.importers.torch_snapshot import SnapshotError, read_snapshot
from gputrace.importers.torch_stream import SnapshotSink
from tests.conftest import ROOT

FIX = ROOT / "fixtures"
FIXTURES = [*sorted(FIX.glob("torch-*/*.pickle*")),
            FIX / "real-h200-torch" / "torch-workload.snapshot.pickle.xz"]
T_US = 1_767_225_600_000_000
BASE = 0x7F00_0000_0000


def _read(path: Path, stream: bool) -> tuple[Any, ...]:
    try:
        s = read_snapshot(path, stream=stream)
    except SnapshotError as e:
        return ("error", str(e))
    s.rows.place(0, None)
    tables = s.rows.tables()
    return (tables, s.facts, s.sha256, s.bytes, s.compression)


def assert_same(path: Path) -> tuple[Any, ...]:
    got, want = _read(path, True), _read(path, False)
    if want[0] == "error" or got[0] == "error":
        assert got == want
        return got
    assert got[1:] == want[1:]
    assert set(got[0]) == set(want[0])
    for name, table in want[0].items():
        assert got[0][name].schema == table.schema, name
        assert got[0][name].equals(table), name
    return got


@pytest.fixture(autouse=True, params=["compiled", "patterns"])
def runs_read_by(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test twice: runs of entries read by the compiled reader (torch_scan) and
    by the byte patterns alone (as where no compiler built it)."""
    if request.param == "patterns":
        monkeypatch.setattr(torch_scan, "compiled", None)
    elif torch_scan.compiled is None:
        pytest.skip("the compiled reader is not built here (test_the_compiled_reader_is_built)")
    return str(request.param)


def test_the_compiled_reader_is_built() -> None:
    """The install builds it on this platform (setup.py, an optional extension)."""
    from gputrace.importers import _entry_scan  # type: ignore[attr-defined]
    assert _entry_scan.scan.__doc__


def _count_fast(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    fast = [0]
    for name in ("_rows", "_scanned_rows"):
        rows = getattr(SnapshotSink, name)

        def counted(self: SnapshotSink, *a: Any, rows: Any = rows) -> int:
            n: int = rows(self, *a)
            fast[0] += n
            return n

        monkeypatch.setattr(SnapshotSink, name, counted)
    return fast


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.parent.name)
def test_every_fixture_reads_the_same(path: Path) -> None:
    tables = assert_same(path)[0]
    assert tables["allocator_segments"].num_rows > 0


def test_the_real_h200_snapshot_reads_the_same() -> None:
    """The fixture is ../shared/real-h200's snapshot byte for byte (fixtures/README.md):
    its 500 trace entries, by both readers."""
    real = FIX / "real-h200-torch" / "torch-workload.snapshot.pickle.xz"
    assert assert_same(real)[0]["allocator_events"].num_rows == 500


def _history(n: int, *, shared_lists: bool = False, devices: int = 1) -> dict[str, Any]:
    """A long history as the benchmark writes it (frames dicts shared, a list per
    entry) or as the real H200 one (frames lists shared), on one or more devices."""
    stacks = [[{"name": f"f{s}_{d}", "filename": f"/p/m{d}.py", "line": d}
               for d in range(3 + s % 5)] for s in range(12)]
    traces = []
    for _ in range(devices):
        trace: list[dict[str, Any]] = [{"action": "segment_alloc", "addr": BASE, "size": 1 << 26,
                                        "stream": 0, "time_us": T_US,
                                        "frames": stacks[0]}]
        for i in range(n):
            fr = stacks[(i * 7) % 12]
            e: dict[str, Any] = {"action": ("alloc", "free_requested", "free_completed")[i % 3],
                                 "addr": BASE + 512 * (i // 3), "size": 512 + i % 4096,
                                 "stream": i % 3, "time_us": T_US + i,
                                 "compile_context": "N/A", "user_metadata": "",
                                 "frames": fr if shared_lists else list(fr)}
            if i % 997 == 5:
                e = {"action": "oom", "device_free": 4096, "size": 1 << 30, "stream": 0,
                     "time_us": T_US + i, "frames": []}
            elif i % 1009 == 7:
                e["frames"] = [*fr, {"name": f"new{i}", "filename": "x.py", "line": i}]
            elif i % 1013 == 9:
                e["compile_context"] = "torch.compile frame 3"
            trace.append(e)
        traces.append(trace)
    seg = {"device": 0, "address": BASE, "total_size": 1 << 26, "allocated_size": 0,
           "active_size": 0, "requested_size": 0, "stream": 0, "segment_type": "large",
           "segment_pool_id": (0, 0), "is_expandable": False, "frames": stacks[0],
           "blocks": [{"address": BASE, "size": 1 << 26, "requested_size": 0,
                       "state": "inactive", "frames": stacks[1]}]}
    return {"segments": [seg], "device_traces": traces,
            "allocator_settings": {"max_split_size": -1}}


@pytest.mark.parametrize(("shared", "devices", "protocol"),
                         [(False, 1, 4), (True, 2, 4), (False, 2, 5), (True, 1, 2)])
def test_long_histories_read_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      shared: bool, devices: int, protocol: int) -> None:
    """6,000 entries a device: ~1 MB of pickle, FRAME opcodes (every 64 KB) inside
    entries, several read buffers; oom entries, new frames and compile contexts mixed
    in take the opcode path. Protocol 4 and 5 take the byte patterns for nearly every
    entry; protocol 2 (BINPUT, no MEMOIZE) reads every entry opcode by opcode."""
    monkeypatch.setattr("gputrace.importers.pickle_stream.CHUNK", 1 << 16)
    monkeypatch.setattr("gputrace.importers.pickle_stream.AHEAD", 1 << 15)
    f = tmp_path / "long.pickle"
    f.write_bytes(pickle.dumps(_history(6000, shared_lists=shared, devices=devices), protocol))
    fast = _count_fast(monkeypatch)
    tables = assert_same(f)[0]
    assert tables["allocator_events"].num_rows == 6001 * devices
    if protocol >= 4:
        assert fast[0] > 0.95 * 6000 * devices, fast[0]
    else:
        assert fast[0] == 0


def test_frames_shared_with_the_segments_keep_their_ids(tmp_path: Path) -> None:
    """The segments' stacks are numbered first, though their entries are read first."""
    snap = _history(50)
    f = tmp_path / "s.pickle"
    f.write_bytes(pickle.dumps(snap, 4))
    tables = assert_same(f)[0]
    ev = tables["allocator_events"].to_pydict()
    seg = tables["allocator_segments"].to_pydict()
    assert seg["stack_id"] == [1] and ev["stack_id"][0] == 1


@pytest.mark.parametrize("bad", [
    {"action": "alloc", "addr": -1, "size": 1, "stream": 0, "time_us": T_US},
    {"action": "alloc", "addr": 1, "size": 1 << 60, "stream": 0, "time_us": T_US},
    {"action": "malloc", "addr": 1, "size": 1, "stream": 0, "time_us": T_US},
    {"action": "alloc", "addr": 1, "size": 1, "stream": 0, "time_us": "late"},
    {"action": "alloc", "addr": 1, "size": 1, "stream": 0, "time_us": T_US,
     "frames": [{"name": 3}]},
    {"action": "alloc", "addr": 1, "size": 1, "stream": 0, "time_us": T_US,
     "frames": "f"},
    {"action": "alloc", "addr": True, "size": 1, "stream": 0, "time_us": T_US},
    ["not", "a", "dict"],
])
def test_a_bad_entry_is_the_same_error(tmp_path: Path, bad: Any) -> None:
    """One bad entry amid 3,000 good ones (after the patterns are learnt): the same
    line, naming the same entry, from both readers."""
    snap = _history(3000)
    snap["device_traces"][0].insert(2500, bad)
    f = tmp_path / "bad.pickle"
    f.write_bytes(pickle.dumps(snap, 4))
    got = assert_same(f)
    assert got[0] == "error" and "device_traces[0][2500]" in got[1], got[1]


def test_a_bad_segment_is_said_before_a_bad_entry(tmp_path: Path) -> None:
    snap = _history(100)
    snap["device_traces"][0][50]["addr"] = -5
    snap["segments"][0]["segment_type"] = "huge"
    f = tmp_path / "both.pickle"
    f.write_bytes(pickle.dumps(snap, 4))
    got = assert_same(f)
    assert got[0] == "error" and "segment_type" in got[1], got[1]


@pytest.mark.parametrize("protocol", [0, 1, 2, 3, 4, 5])
def test_every_protocol_reads_the_same(tmp_path: Path, protocol: int) -> None:
    """Protocols 0 and 1 (text opcodes) go to the reference reader whole."""
    f = tmp_path / "p.pickle"
    f.write_bytes(pickle.dumps(_history(300, devices=2), protocol))
    assert_same(f)


def test_odd_but_plain_values_read_the_same(tmp_path: Path) -> None:
    snap = _history(20)
    snap["allocator_settings"] = {"a": 1.5, "b": b"x", "c": {1, 2}, "d": frozenset({3}),
                                  "e": (1, 2, 3), "f": bytearray(b"y"), "g": None,
                                  "h": True, "i": 10**30, "j": "é\udcff"}
    snap["external_annotations"] = [{"k": [1, 2]}] * 3
    f = tmp_path / "odd.pickle"
    f.write_bytes(pickle.dumps(snap, 5))
    assert_same(f)


def test_shared_device_lists_are_refused_alike(tmp_path: Path) -> None:
    trace = _history(10)["device_traces"][0]
    snap = {"segments": [], "device_traces": [trace, trace]}
    f = tmp_path / "twice.pickle"
    f.write_bytes(pickle.dumps(snap, 4))
    got = assert_same(f)
    assert got[0] == "error" and "second reference" in got[1], got[1]


def test_a_global_is_refused_by_the_stream_reader(tmp_path: Path) -> None:
    snap = _history(3000)
    data = pickle.dumps(snap, 4)
    # a GLOBAL opcode spliced in after the histories: the stream reader sees it there
    f = tmp_path / "global.pickle"
    cut = data.rindex(b"allocator_settings")
    f.write_bytes(data[:cut - 2] + b"cos\nsystem\n" + data[cut - 2:])
    with pytest.raises(Exception, match=r"names the global os\.system"):
        read_snapshot(f)


def test_a_tuple_key_is_refused_before_it_is_hashed(tmp_path: Path) -> None:
    """A tuple nested 60 deep through memo references: hashing it would take 2^60
    steps; the stream reader refuses it at once."""
    body = b"\x80\x04}\x94(\x8c\x08segments\x94]\x94N\x85\x940"  # memo 3: (None,)
    for i in range(3, 63):  # memo i + 1: (memo i, memo i), popped
        body += b"h" + bytes([i]) + b"h" + bytes([i]) + b"\x86\x940"
    body += b"h" + bytes([63]) + b"Nu."  # {'segments': [], <depth 60>: None}
    f = tmp_path / "tuple.pickle"
    f.write_bytes(body)
    t0 = time.monotonic()
    with pytest.raises(Exception, match="tuple as a dict key"):
        read_snapshot(f)
    assert time.monotonic() - t0 < 2


# VmHWM, not ru_maxrss: a child's ru_maxrss starts at its parent's (the test runner's)
_RSS = """
import sys
from gputrace.importers.torch_snapshot import read_snapshot
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
before = hwm()
s = read_snapshot(sys.argv[1], stream=sys.argv[2] == "1")
assert s.rows.event_count > 100000
print((hwm() - before) // 1024)
"""


def test_a_long_history_is_not_held(tmp_path: Path) -> None:
    """300,000 entries (18 MB of pickle): the reference reader holds the unpickled
    history (~850 bytes an entry); the stream reader its rows, as Arrow (~100 bytes an
    entry) and at most one chunk of Python lists."""
    f = tmp_path / "big.pickle"
    f.write_bytes(pickle.dumps(_history(300_000), 4))
    grew = {}
    for stream in ("0", "1"):
        out = subprocess.run([sys.executable, "-c", _RSS, str(f), stream], cwd=ROOT,
                             capture_output=True, text=True, check=True)
        grew[stream] = int(out.stdout)
    assert grew["0"] > 200 and grew["1"] < 0.6 * grew["0"], grew


@pytest.mark.parametrize("streams", [
    [-1],  # BININT, negative, one width: the same-width path
    [0, 7, 300, 70_000, -1, -(1 << 40), 1 << 40, (1 << 63) + 5, (1 << 64) - 1],  # mixed
    [(1 << 63) - 1, -(1 << 63)],  # LONG1 of 8 bytes, both signs
])
def test_integers_of_every_width_read_the_same(tmp_path: Path, streams: list[int]) -> None:
    """Streams and addresses of every integer opcode and width, decoded by column:
    the same values as the per-entry path (a 9-byte LONG1, 2^63 and more, is left to
    it)."""
    snap = _history(3000)
    for i, e in enumerate(snap["device_traces"][0][1:]):
        if e["action"] != "oom":
            e["stream"] = streams[i % len(streams)]
            e["addr"] = (1 << (8 + (i % 50))) + i
    f = tmp_path / "ints.pickle"
    f.write_bytes(pickle.dumps(snap, 4))
    tables = assert_same(f)[0]
    got = set(tables["allocator_events"].column("stream").to_pylist())
    assert {s & ((1 << 64) - 1) for s in streams} <= got
