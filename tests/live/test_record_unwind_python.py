"""Native frames through libraries without frame pointers BELOW Python's frames,
and the Python frames merged where the interpreter's eval loop was: does each
cuMemAlloc_v2 of tests/standin_cuda/py_chain.py (Debian's CPython 3.11, whose
interpreter is built without frame pointers, calling libchain_a.so through
ctypes: chain_a (no frame pointers) -> chain_b (frame pointers) -> chain_c (none)
-> cuMemAlloc_v2) carry chain_c, chain_b, chain_a exactly, then libffi's and
_ctypes' frames, the interpreter's, the Python frames call_chain, main and
<module> at their lines in place of the eval loop's native frame, and the
interpreter's frames below it down to libc?

main's walk (tables for the 8 top frames while they lie in a library with one,
then frame pointers) gave the three chain frames at most (tests/live/
test_record_unwind_chain.py says why it lost chain_a's callers), with the
Python frames appended after them: no interpreter frame, so the merge had no
eval-loop frame to put them at."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from gputrace.trace.reader import open_trace
from tests.record_helpers import (
    ROOT,
    RecorderProc,
    live_skip_reason,
    record_cmd,
    return_addresses,
)

WORKLOAD = ROOT / "tests" / "standin_cuda" / "py_chain.py"
PYTHON = Path("/usr/bin/python3")
CALLS = 2


def _line(marker: str) -> int:
    lines = WORKLOAD.read_text().splitlines()
    return next(i for i, x in enumerate(lines, 1) if x.endswith(f"# PLANT: {marker}"))


def _record(tmp: Path, lib_dir: Path) -> Path:
    """py_chain.py recorded with `-p`, the recorder stopped while it lives."""
    w = subprocess.Popen([str(PYTHON), str(WORKLOAD), str(lib_dir)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert w.stdin is not None and w.stdout is not None
    out = tmp / "trace"
    try:
        assert w.stdout.readline() == f"READY {w.pid}\n"
        rec = RecorderProc(record_cmd(out, "-p", str(w.pid)))
        rec.wait_ready()
        w.stdin.write("go\n")
        w.stdin.flush()
        assert w.stdout.readline() == "ALLOCATED\n"
        rec.proc.send_signal(signal.SIGINT)
        assert rec.wait() == 0, "".join(rec.stderr)
        w.stdin.write("bye\n")
        w.stdin.flush()
        assert w.stdout.readline() == "DONE\n"
    finally:
        w.kill()
        w.wait()
    return out


@pytest.mark.live
@pytest.mark.skipif(live_skip_reason() is not None, reason=str(live_skip_reason()))
@pytest.mark.skipif(not PYTHON.exists(), reason=f"{PYTHON} not installed")
def test_unwinder_reaches_python_frames_through_libraries_without_frame_pointers(
        tmp_path: Path) -> None:  # fmt: skip
    from tests.standin_cuda.standin_cuda import build

    lib_dir = build().lib_dir
    a, b, c = (lib_dir / f"libchain_{x}.so" for x in "abc")
    ra, rb, rc = (return_addresses(p) for p in (a, b, c))
    t = open_trace(_record(tmp_path, lib_dir))
    assert t.status == "complete" and t.manifest["api"]["stack_errors"] == 0
    calls = t.scan("cuda_calls").collect()
    ids = calls.filter(calls["func"] == "cuMemAlloc_v2")["stack_id"].to_list()
    assert len(ids) == CALLS and len(set(ids)) == 1
    rows = (t.scan("stacks").collect().filter(stack_id=ids[0]).sort("depth")
            .select("kind", "module", "offset", "symbol", "function", "filename", "line").rows())
    assert [r[1:4] for r in rows[:3]] == [
        (str(c), rc[("chain_c", "cuMemAlloc_v2")], "chain_c"),
        (str(b), rb[("chain_b", "chain_c")], "chain_b"),
        (str(a), ra[("chain_a", "chain_b")], "chain_a"),
    ]
    first_py = next(i for i, r in enumerate(rows) if r[0] == "python")
    # between the chain and the Python frames: ctypes' call and the interpreter's
    # native frames, each in its library, no frame lost to an unknown module
    between = {os.path.basename(r[1]).split(".")[0] for r in rows[3:first_py]}
    assert between == {"libffi", "_ctypes", "python3"}, between
    assert rows[first_py - 1][1] == os.path.realpath(PYTHON)
    py = [r for r in rows if r[0] == "python"]
    assert [(r[4], r[5], r[6]) for r in py] == [
        ("call_chain", str(WORKLOAD), _line("call")),
        ("main", str(WORKLOAD), _line("main")),
        ("<module>", str(WORKLOAD), _line("module")),
    ]
    # the Python frames stand where the eval loop's frame was: contiguous, with
    # the interpreter's own frames below them, down to libc
    last_py = first_py + len(py) - 1
    assert all(r[0] == "python" for r in rows[first_py:last_py + 1])
    below = rows[last_py + 1:]
    assert [r[3] for r in below if r[3] in ("PyEval_EvalCode", "Py_RunMain")] == [
        "PyEval_EvalCode", "Py_RunMain"]
    assert os.path.basename(below[-1][1]).startswith("libc.so")
