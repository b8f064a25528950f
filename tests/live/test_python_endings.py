"""Python frames of programs that end right after their last allocation, with no
waiting protocol (tests/standin_cuda/py_endings.py): returning, an uncaught
RuntimeError("CUDA out of memory"), sys.exit, os._exit, a daemon thread still
allocating while the main thread exits, SIGTERM and SIGKILL from the launcher.
One `gputrace record -- sh -c ...` runs every ending under every CPython on the
machine (a recording costs ~13 s of CPU: one for all); each leak's Python frames
are named with their function, file and line exactly (root, bcc)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import polars as pl
import pytest

from gputrace.trace.reader import open_trace
from tests.record_helpers import INTERPRETERS, ROOT, RUN_S, live_skip_reason, record_cmd

pytestmark = [pytest.mark.live, pytest.mark.xdist_group("python_endings")]
_SKIP = live_skip_reason()
if _SKIP is not None:
    pytestmark.append(pytest.mark.skip(reason=_SKIP))

PROGRAM = ROOT / "tests" / "standin_cuda" / "py_endings.py"
ENDINGS = ("normal", "exception", "sys_exit", "os_exit", "thread", "sigterm", "sigkill",
           "forged_table")
SIGNALLED = {"sigterm": "TERM", "sigkill": "KILL"}
MIB = 1 << 20
STEPS = 3  # py_endings.STEPS


def _line(marker: str) -> int:
    lines = PROGRAM.read_text().splitlines()
    return next(i for i, x in enumerate(lines, 1) if x.endswith(f"# PLANT: {marker}"))


def _calls_line(callee: str, caller_def: str) -> int:
    """The line in `def caller_def` (or at module level, caller_def None) that calls
    `callee(`."""
    lines = PROGRAM.read_text().splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith(f"def {caller_def}("))
    return next(i for i, x in enumerate(lines[start:], start + 1)
                if x.strip().startswith(f"{callee}("))


def _module_line() -> int:
    lines = PROGRAM.read_text().splitlines()
    return next(i for i, x in enumerate(lines, 1) if x.strip() == "main(sys.argv)")


@dataclass
class Endings:
    trace: Any
    pids: dict[tuple[str, str], int]  # (interpreter, ending) -> pid
    stdout: str


@pytest.fixture(scope="module")
def endings(tmp_path_factory: pytest.TempPathFactory) -> Endings:
    from tests.standin_cuda.standin_cuda import StandinCudaUnavailable, build

    try:
        lib = str(build().libcuda)
    except StandinCudaUnavailable as e:
        pytest.skip(str(e))
    tmp = tmp_path_factory.mktemp("py-endings")
    logs = tmp / "logs"
    logs.mkdir()
    runs = [(n, e) for n, exe in INTERPRETERS.items() if exe.exists() for e in ENDINGS]
    lines = []
    for i, (name, ending) in enumerate(runs):
        argv = " ".join(shlex.quote(str(a)) for a in
                        (INTERPRETERS[name], PROGRAM, lib, ending, logs / f"{name}-{ending}"))
        if ending in SIGNALLED:
            # the launcher signals the program once it has allocated (its line read
            # from a fifo), as a job scheduler ends a job
            fifo = shlex.quote(str(tmp / f"fifo{i}"))
            lines.append(f"mkfifo {fifo}; {argv} > {fifo} 2>/dev/null & p=$!; "
                         f"read line < {fifo}; echo \"$line\"; kill -{SIGNALLED[ending]} $p; "
                         "wait $p")
        else:
            lines.append(f"{argv} 2>/dev/null")
        lines.append(f"echo {name} {ending} $?")
    env = {k: v for k, v in os.environ.items() if k != "GPUTRACE_STANDIN_DEVDIR"}
    out = tmp / "trace"
    r = subprocess.run(record_cmd(out, "--", "sh", "-c", "\n".join(lines)), cwd=ROOT,
                       capture_output=True, text=True, timeout=RUN_S + 60, env=env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    pids = {}
    for name, ending in runs:
        pid, said = (logs / f"{name}-{ending}").read_text().split()
        assert said == ending
        pids[(name, ending)] = int(pid)
    return Endings(open_trace(out), pids, r.stdout)


def test_every_ending_ended_as_planted(endings: Endings) -> None:
    """The programs really ended each way (exit statuses as the shell saw them)."""
    want = {"normal": "0", "forged_table": "0", "exception": "1", "sys_exit": "3",
            "os_exit": "0", "thread": "0", "sigterm": str(128 + 15), "sigkill": str(128 + 9)}
    status = {tuple(ln.split()[:2]): ln.split()[2] for ln in endings.stdout.splitlines()
              if len(ln.split()) == 3}
    for (name, ending) in endings.pids:
        assert status[(name, ending)] == want[ending], (name, ending)
    t = endings.trace
    assert t.status == "complete" and sum(t.drops.values()) == 0
    py = t.manifest["api"]["python"]
    assert py["warnings"] == []
    assert py["unknown_frames"] == 0, py


def _python_rows(t: Any, pid: int, size: int) -> list[tuple[Any, ...]]:
    """The Python frames of `pid`'s allocations of `size`: the same for every call.
    (Their stack ids may differ: a call walked before the process's unwind tables were
    loaded, on a loaded host, has a shorter native part.)"""
    calls = t.scan("cuda_calls").filter((pl.col("pid") == pid) & (pl.col("size_bytes") == size)
                                        & (pl.col("func") == "cuMemAlloc_v2")).collect()
    sids = calls["stack_id"].unique().to_list()
    assert sids and None not in sids, (pid, size, sids)
    per_stack = []
    for sid in sids:
        stacks = t.scan("stacks").filter((pl.col("pid") == pid) & (pl.col("stack_id") == sid)
                                         & (pl.col("kind") == "python")).collect()
        per_stack.append(stacks.sort("depth").select("function", "filename", "line").rows())
    assert all(rows == per_stack[0] for rows in per_stack), (pid, size, per_stack)
    return per_stack[0]


@pytest.mark.parametrize("ending", ENDINGS)
@pytest.mark.parametrize("name", list(INTERPRETERS))
def test_leak_named_however_the_program_ends(endings: Endings, name: str, ending: str) -> None:
    if (name, ending) not in endings.pids:
        pytest.skip(f"{INTERPRETERS[name]} not installed")
    t, pid = endings.trace, endings.pids[(name, ending)]
    assert t.manifest["api"]["python"]["versions"][str(pid)] == name.removeprefix("debian-")
    calls = t.scan("cuda_calls").filter((pl.col("pid") == pid) & (pl.col("size_bytes") == MIB)
                                        ).collect()
    assert calls.height == STEPS
    f = str(PROGRAM)
    rows = _python_rows(t, pid, MIB)
    if ending == "forged_table":
        # named, from the same file; the forged table gives a line only where it
        # says one (3.10's says a new line per instruction: not the source's)
        assert rows[0][:2] == ("leak", f)
        if name != "3.10":
            assert rows[0][2] is None
        rows = [(fn, fl, ln) if fn != "leak" else ("leak", f, _line("leak"))
                for fn, fl, ln in rows]
    assert rows == [
        ("leak", f, _line("leak")), ("step", f, _calls_line("leak", "step")),
        ("train", f, _calls_line("step", "train")), ("main", f, _calls_line("train", "main")),
        ("<module>", f, _module_line())]
    if ending == "thread":
        rows = _python_rows(t, pid, 4 * MIB)
        assert rows[0] == ("worker_leak", f, _line("thread"))
        assert all(fn is not None and line is not None for fn, _f, line in rows)
        assert any(fn.endswith("_bootstrap") and fl.endswith("threading.py")
                   for fn, fl, _l in rows)


def test_info_says_no_frame_unknown(endings: Endings) -> None:
    r = subprocess.run([sys.executable, "-m", "gputrace.cli", "info", str(endings.trace.path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("python "))
    assert line.endswith(" 0 unknown"), line
