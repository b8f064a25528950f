"""The compiled reader of trace entries (importers/_entry_scan.c, torch_scan) on bytes
nobody wrote on purpose: SYNTHETIC histories (built here) cut at every byte, mutated
at random, and random bytes. It must never read outside its buffer or loop, must
pause where an entry is cut, and must accept exactly the entries the byte patterns
accept: a mutated snapshot reads to the same tables, or the same error, both ways."""

from __future__ import annotations

import pickle
import random
import shutil
import subprocess
import sysconfig
from pathlib import Path
from typing import Any

import pytest

from gputrace.errors import GputraceError
from gputrace.importers import torch_scan
from gputrace.importers.torch_patterns import FAST_KEYS, entry_spec
from gputrace.importers.torch_snapshot import read_snapshot
from tests.conftest import ROOT
from tests.record_helpers import INTERPRETERS
from tests.unit.importers.test_torch_stream import _history

pytestmark = pytest.mark.skipif(torch_scan.compiled is None,
                                reason="the compiled reader is not built here "
                                "(test_torch_stream.py::test_the_compiled_reader_is_built)")

KEYS = ("action", "addr", "size", "stream", "time_us", "frames")
SLOTS = {"action": 1, "addr": 2, "size": 3, "stream": 4, "time_us": 300, "frames": 5}


def _ref(i: int) -> bytes:
    return b"h" + bytes([i]) if i < 256 else b"j" + i.to_bytes(4, "little")


def _entry(addr: int, frames: list[int]) -> bytes:
    """One entry of KEYS as a protocol-4 pickler writes it (action: memo 9)."""
    body = (_ref(SLOTS["action"]) + _ref(9) + _ref(SLOTS["addr"]) + b"\x8a\x06"
            + addr.to_bytes(6, "little") + _ref(SLOTS["size"]) + b"M\x00\x02"
            + _ref(SLOTS["stream"]) + b"K\x00" + _ref(SLOTS["time_us"]) + b"J\x01\x02\x03\x04"
            + _ref(SLOTS["frames"]) + b"]\x94")
    if len(frames) == 1:
        body += _ref(frames[0]) + b"a"
    elif frames:
        body += b"(" + b"".join(_ref(f) for f in frames) + b"e"
    return b"}\x94(" + body + b"u"


RUN = b"".join(_entry(0x7F00_0000_0000 + 512 * k, [20 + k % 3, 400, 21][: 1 + k % 3])
               for k in range(6))
SPEC = entry_spec(KEYS, SLOTS)


def test_a_run_reads_to_columns() -> None:
    got = torch_scan.scan(RUN + b"ea", 0, SPEC)  # the list ends: APPENDS, APPEND
    assert (got.n, got.stop, got.paused) == (6, len(RUN), False)
    assert got.addr.tolist() == [0x7F00_0000_0000 + 512 * k for k in range(6)]
    assert got.size.tolist() == [512] * 6 and got.stream.tolist() == [0] * 6
    assert got.time_us.tolist() == [0x04030201] * 6
    assert got.keyed["action"].values == [b"h\x09"]
    fr = got.keyed["frames"]
    assert len(fr.values) == 3 and fr.index.tolist() == [0, 1, 2, 0, 1, 2]
    assert fr.first.tolist() == [0, 1, 2]
    assert got.keyed["compile_context"].values == [b""]  # absent from the shape
    assert got.starts.tolist()[-1] == len(RUN)


def test_the_next_batch_is_crossed_and_the_list_end_is_not() -> None:
    """APPENDS MARK between two entries is crossed (the next entry starts after the
    MARK); APPENDS then anything else ends the run before the APPENDS."""
    one, two = _entry(512, [20, 21]), _entry(1024, [20, 21])
    got = torch_scan.scan(one + b"e(" + two + b"ea", 0, SPEC)
    assert (got.n, got.stop) == (2, len(one) + 2 + len(two))
    assert got.starts.tolist() == [0, len(one) + 2, got.stop]
    got = torch_scan.scan(one + b"e(" + b"N" + b"e", 0, SPEC)
    assert (got.n, got.stop, got.paused) == (1, len(one), False)


def test_every_cut_pauses_where_an_entry_is_cut() -> None:
    ends = [0]
    for k in range(6):
        ends.append(ends[-1] + len(_entry(0x7F00_0000_0000 + 512 * k,
                                          [20 + k % 3, 400, 21][: 1 + k % 3])))
    for cut in range(len(RUN) + 1):
        got = torch_scan.scan(RUN[:cut], 0, SPEC)
        whole = sum(1 for e in ends[1:] if e <= cut)
        assert got.n == whole, cut
        assert got.stop == ends[whole], cut
        assert got.paused, cut  # the buffer ends inside or right after an entry


@pytest.mark.parametrize("seed", range(4))
def test_random_bytes_are_read_safely(seed: int) -> None:
    """Random buffers, and the run with random bytes changed, at random places: any
    answer within the buffer (no crash, no loop)."""
    rnd = random.Random(seed)
    for _ in range(2000):
        if rnd.random() < 0.5:
            buf = bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 300)))
        else:
            b = bytearray(RUN)
            for _ in range(rnd.randrange(1, 6)):
                b[rnd.randrange(len(b))] = rnd.choice([0x95, 0x94, 0x28, 0x65, 0x68, 0x6A,
                                                       0x8A, 0x75, rnd.randrange(256)])
            buf = bytes(b)
        pos = rnd.randrange(len(buf) + 1)
        got = torch_scan.scan(buf, pos, SPEC)
        assert pos <= got.stop <= len(buf)
        assert len(got.starts) == got.n + 1 and got.starts[-1] == got.stop
    with pytest.raises(ValueError, match="pos outside"):
        torch_scan.scan(RUN, len(RUN) + 1, SPEC)
    with pytest.raises(ValueError, match="bad spec"):
        torch_scan.scan(RUN, 0, bytes([len(FAST_KEYS), 1, 0]))


def _outcome(path: Path) -> Any:
    try:
        s = read_snapshot(path)
    except GputraceError as e:  # refused or not a snapshot: its one line
        return ("error", str(e))
    s.rows.place(0, None)
    return {k: v.to_pydict() for k, v in s.rows.tables().items()}


@pytest.mark.parametrize("protocol", [4, 5])
def test_mutated_snapshots_read_alike_both_ways(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                protocol: int) -> None:
    """A 400-entry history with bytes of its histories changed (opcodes the readers
    key on, or any byte), 60 times: the compiled reader and the byte patterns give the
    same tables or the same error."""
    data = pickle.dumps(_history(400, devices=2), protocol)
    lo = data.index(b"device_traces")
    hi = data.rindex(b"allocator_settings")
    rnd = random.Random(protocol)
    compiled = torch_scan.compiled
    for case in range(60):
        b = bytearray(data)
        for _ in range(rnd.randrange(1, 4)):
            b[rnd.randrange(lo, hi)] = rnd.choice([0x95, 0x94, 0x28, 0x65, 0x68, 0x6A,
                                                   0x8A, 0x4A, 0x75, 0x4E, rnd.randrange(256)])
        f = tmp_path / f"m{case}.pickle"
        f.write_bytes(bytes(b))
        monkeypatch.setattr(torch_scan, "compiled", compiled)
        fast = _outcome(f)
        monkeypatch.setattr(torch_scan, "compiled", None)
        assert _outcome(f) == fast, case


_BUILD_AND_SCAN = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("_entry_scan", sys.argv[1])
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
n, stop, paused, starts, ints, keyed = m.scan(bytes.fromhex(sys.argv[2]), 0,
                                               bytes.fromhex(sys.argv[3]))
print(n, stop, paused)
"""


@pytest.mark.parametrize("version", ["3.10", "3.11", "3.12", "3.13", "debian-3.11"])
def test_it_builds_and_reads_on_every_supported_python(tmp_path: Path, version: str) -> None:
    """The C source compiles warning-free against each interpreter's headers (as pip
    builds it there) and reads a run in that interpreter."""
    python = INTERPRETERS[version]
    if not python.exists() or shutil.which("gcc") is None:
        pytest.skip(f"no {version} interpreter or no gcc here")
    include = subprocess.run([str(python), "-c", "import sysconfig; "
                              "print(sysconfig.get_paths()['include'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    if not (Path(include) / "Python.h").exists():
        pytest.skip(f"{version} has no development headers here")
    so = tmp_path / f"_entry_scan{sysconfig.get_config_var('SHLIB_SUFFIX') or '.so'}"
    cc = subprocess.run(["gcc", "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC",
                         f"-I{include}", str(ROOT / "gputrace/importers/_entry_scan.c"),
                         "-o", str(so)], capture_output=True, text=True, check=False)
    assert cc.returncode == 0, cc.stderr
    got = subprocess.run([str(python), "-c", _BUILD_AND_SCAN, str(so), (RUN + b"ea").hex(),
                          SPEC.hex()], capture_output=True, text=True, check=False)
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["6", str(len(RUN)), "0"]
