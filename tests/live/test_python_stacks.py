"""Python frames on API-layer stacks, live, under every CPython on the machine:
tests/standin_cuda/py_workload.py calls the stand-in libcuda through ctypes from
named nested functions (one call from a thread), and the leak report names the
planted function, file and line of each leak exactly (root, bcc)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from gputrace.trace.reader import open_trace
from tests.record_helpers import (
    INTERPRETERS,
    PYENV,
    ROOT,
    live_skip_reason,
    record_cmd,
    record_py_workload,
)
from tests.record_helpers import PY_WORKLOAD as WORKLOAD

pytestmark = [pytest.mark.live]
_SKIP = live_skip_reason()
if _SKIP is not None:
    pytestmark.append(pytest.mark.skip(reason=_SKIP))

MIB = 1 << 20


def _line(marker: str) -> int:
    """The line of the workload that carries `# PLANT: marker`."""
    lines = WORKLOAD.read_text().splitlines()
    return next(i for i, x in enumerate(lines, 1) if x.endswith(f"# PLANT: {marker}"))


def _calls_line(callee: str, caller_def: str) -> int:
    """The line in `def caller_def` that calls `callee(`."""
    lines = WORKLOAD.read_text().splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith(f"def {caller_def}("))
    return next(i for i, x in enumerate(lines[start:], start + 1)
                if x.strip().startswith(f"{callee}("))


def _record(tmp_path: Path, exe: Path, *args: str) -> tuple[Path, int]:
    """Record the workload with `-p` (record_helpers.record_py_workload); returns
    (trace, pid)."""
    out = tmp_path / "trace"
    return out, record_py_workload(out, exe, *args)


def _leak_report(trace: Path) -> dict[str, Any]:
    r = subprocess.run([sys.executable, "-m", "gputrace.cli", "analyze", str(trace), "--only",
                        "leaks", "--format", "json"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _sites(report: Any) -> list[tuple[int, int, list[str]]]:
    """(bytes, allocations, frames) of every leak site in the JSON leak report."""
    found: list[tuple[int, int, list[str]]] = []

    def walk(x: Any) -> None:
        if isinstance(x, dict):
            if "frames" in x and isinstance(x["frames"], (str, list)):
                fr = x["frames"]
                frames = fr if isinstance(fr, list) else fr.split(" < ")
                found.append((x.get("bytes", x.get("leaked_bytes")),
                              x.get("count", x.get("allocations")), frames))
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(report)
    return found


@pytest.mark.parametrize("name", list(INTERPRETERS))
def test_leak_report_names_python_lines(tmp_path: Path, name: str) -> None:
    exe = INTERPRETERS[name]
    if not exe.exists():
        pytest.skip(f"{exe} not installed")
    trace, pid = _record(tmp_path, exe, "--thread")
    t = open_trace(trace)
    py = t.manifest["api"]["python"]
    version = name.removeprefix("debian-")
    # the target's entry: a Python process of another test that loads the stand-in
    # libcuda at the same moment pauses at its library load and can be listed beside it
    assert py["versions"][str(pid)] == version
    assert py["warnings"] == [] and py["unknown_frames"] == 0
    base = WORKLOAD.name
    leak = [f"leak ({base}:{_line('leak')})", f"middle ({base}:{_calls_line('leak', 'middle')})",
            f"outer ({base}:{_calls_line('middle', 'outer')})",
            f"main ({base}:{_calls_line('outer', 'main')})"]
    thread = f"worker ({base}:{_line('thread')})"
    sites = _sites(_leak_report(trace))
    python_sites = {}
    for _b, _n, frames in sites:
        py_frames = [f for f in frames if re.search(r"\(\S+:\d+\)$", f)]
        if py_frames:
            python_sites[py_frames[0]] = py_frames
    # the leak: its Python frames innermost first, from the planted line to main
    assert python_sites[leak[0]][:4] == leak
    assert python_sites[leak[0]][4].startswith(f"<module> ({base}:")
    # the thread's leak: its own stack, from the thread's function down to threading's
    assert python_sites[thread][0] == thread
    assert any(f.startswith("_bootstrap (threading.py:") or
               f.startswith("Thread._bootstrap (threading.py:") for f in python_sites[thread])
    # the freed scratch allocation is no leak
    assert not any(k.startswith("scratch (") for k in python_sites)
    # the stacks table itself: exact rows of the leak's Python frames
    calls = t.scan("cuda_calls").collect()
    stacks = t.scan("stacks").collect()
    sid = calls.filter(pl.col("size_bytes") == MIB)["stack_id"].unique().to_list()
    assert len(sid) == 1
    rows = (stacks.filter((pl.col("stack_id") == sid[0]) & (pl.col("kind") == "python"))
            .sort("depth").select("function", "filename", "line").rows()[:4])
    assert rows == [("leak", str(WORKLOAD), _line("leak")),
                    ("middle", str(WORKLOAD), _calls_line("leak", "middle")),
                    ("outer", str(WORKLOAD), _calls_line("middle", "outer")),
                    ("main", str(WORKLOAD), _calls_line("outer", "main"))]


def test_interpreter_exits_mid_recording(tmp_path: Path) -> None:
    """A Python process that exits before the recorder's next drain: no crash, every
    Python frame kept as a row, named when its code object was read in time and
    marked unknown (function null, counted in the manifest) otherwise."""
    from tests.standin_cuda.standin_cuda import build

    exe = INTERPRETERS["3.12"]
    if not exe.exists():
        pytest.skip(f"{exe} not installed")
    out = tmp_path / "trace"
    r = subprocess.run(record_cmd(out, "--", str(exe), str(WORKLOAD), str(build().libcuda),
                                  "--depth", "12"),
                       cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "DONE"
    t = open_trace(out)
    assert t.status == "complete"
    py = t.manifest["api"]["python"]
    stacks = t.scan("stacks").collect().filter(pl.col("kind") == "python")
    calls = t.scan("cuda_calls").collect().filter(pl.col("func") == "cuMemAlloc_v2")
    assert calls.height == 5 and calls["stack_id"].null_count() == 0
    deep = calls.filter(pl.col("size_bytes") == 8 * MIB)["stack_id"][0]
    deep_rows = stacks.filter(pl.col("stack_id") == deep)
    assert deep_rows.height == 12 + 2  # deep x 12, main, <module>
    assert py["frames"] == stacks.height
    assert py["unknown_frames"] == stacks["function"].null_count()
    named = stacks.filter(pl.col("function").is_not_null())
    assert set(named["function"].to_list()) <= {"leak", "middle", "outer", "main", "<module>",
                                                "scratch", "deep"}


def test_unknown_python_version_native_frames_only(tmp_path: Path) -> None:
    """CPython 3.9 (a layout gputrace has no table for): native frames only, one
    line in the manifest and in `gputrace info`, never guessed Python frames."""
    exe = PYENV / "3.9.18" / "bin" / "python"
    if not exe.exists():
        pytest.skip(f"{exe} not installed")
    trace, pid = _record(tmp_path, exe)
    t = open_trace(trace)
    py = t.manifest["api"]["python"]
    line = (f"pid {pid}: CPython 3.9 (libpython3.9.so.1.0): a version whose layout this "
            "gputrace does not know; native frames only")
    assert py["warnings"] == [line] and py["versions"] == {} and py["frames"] == 0
    stacks = t.scan("stacks").collect()
    assert stacks.height > 0 and stacks.filter(pl.col("kind") == "python").height == 0
    info = subprocess.run([sys.executable, "-m", "gputrace.cli", "info", str(trace)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert info.returncode == 0, info.stderr
    assert f"warning: Python frames: {line}" in info.stdout.splitlines()
