"""Helpers for the live `gputrace record` tests: skip reasons and a recorder
subprocess that is waited on through its ready line, never through sleeps."""

from __future__ import annotations

import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from gputrace.errors import GputraceError

ROOT = Path(__file__).resolve().parent.parent
READY = "gputrace: recording ("
COMPILE_S = 240.0
"""Bound on waits that include compiling the BPF programs (the ready line, lines the
recorder prints before it): bcc compiles for tens of seconds on a loaded 2-core host.
A deadline, never a sleep and never a timing assertion."""
RUN_S = COMPILE_S + 120.0
"""Bound on a whole `gputrace record` run: its compile plus a short workload."""


def standin_driver_args() -> list[str]:
    """--driver-version for traces of the FUSE stand-in (it answers with those layouts)."""
    from tests.standin.standin import DRIVER_VERSION

    return ["--driver-version", DRIVER_VERSION]


def live_skip_reason() -> str | None:
    """Why live recording cannot run here (None when it can)."""
    if os.geteuid() != 0:
        return "live recording needs root"
    from gputrace.record import loader

    try:
        loader.import_bcc()
        loader.check_headers()
    except GputraceError as e:
        return f"{e} (run scripts/setup-record.sh)"
    from tests.standin.standin import skip_reason

    return skip_reason()


def record_cmd(out: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "gputrace.cli", "record", "-o", str(out), *args]


class RecorderProc:
    """`gputrace record` in the background; `wait_ready` blocks on its ready line."""

    def __init__(self, argv: list[str], stdin: int = subprocess.DEVNULL,
                 env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            argv, cwd=ROOT, stdin=stdin, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.stderr: list[str] = []
        self._t = threading.Thread(target=self._pump, daemon=True)
        self._t.start()

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def wait_ready(self, timeout: float = COMPILE_S) -> None:
        while True:
            try:
                line = self.lines.get(timeout=timeout)
            except queue.Empty:
                self.proc.kill()
                raise AssertionError(f"recorder not ready in {timeout}s") from None
            if line is None:
                raise AssertionError(f"recorder exited early: {''.join(self.stderr)}")
            if line.startswith(READY):
                return

    def wait(self, timeout: float = 60.0) -> int:
        rc = self.proc.wait(timeout=timeout)
        self._t.join(timeout=timeout)
        return rc


def return_addresses(exe: Path) -> dict[tuple[str, str], int]:
    """(function, callee) -> link-time address of the instruction after that call."""
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(exe)], check=True,
                          capture_output=True, text=True).stdout  # fmt: skip
    out: dict[tuple[str, str], int] = {}
    func, pending = "", None
    for line in text.splitlines():
        if m := re.match(r"^[0-9a-f]+ <([^>]+)>:$", line):
            func, pending = m.group(1), None
            continue
        if not (m := re.match(r"^\s+([0-9a-f]+):\s+(.*)$", line)):
            continue
        if pending is not None:
            out.setdefault(pending, int(m.group(1), 16))
            pending = None
        if c := re.match(r"call\s+[0-9a-f]+ <([^>@]+)", m.group(2)):
            pending = (func, c.group(1))
    return out


STORM = ROOT / "benchmarks" / "alloc_storm" / "storm.c"


def storm_program(tmp: Path) -> Path:
    """benchmarks' storm.c built against the stand-in libcuda (frame pointers kept):
    a known deep stack of descend() frames below main."""
    from tests.standin_cuda.standin_cuda import link_program

    return link_program(STORM, tmp / "alloc_storm")


def record_dlopen_twin(out: Path) -> Any:
    """`record -p` of the twin that dlopen()s libcuda only after the recorder is
    ready (not mapped before); the trace, once both ended cleanly."""
    from gputrace.trace.reader import open_trace
    from tests.standin_cuda.standin_cuda import waiting_workload

    with waiting_workload("--quiet", dlopen=True) as w:
        assert "libcuda" not in Path(f"/proc/{w.pid}/maps").read_text()
        rec = RecorderProc(record_cmd(out, "-p", str(w.pid)))
        rec.wait_ready()
        rc, stdout, err = w.go()
        assert rc == 0, err
        assert "LOADED" in stdout
    assert rec.wait() == 0, "".join(rec.stderr)
    return open_trace(out)


Stacks = list[list[tuple[Any, ...]]]


def check_stack_trace(t: Any) -> None:
    """What every stack test relies on in a whole trace: complete, no drop, no stack
    error."""
    assert t.status == "complete" and sum(t.drops.values()) == 0
    assert t.manifest["api"]["stack_errors"] == 0


def alloc_stacks(t: Any, allocs: int, columns: tuple[str, ...],
                 pid: int | None = None) -> Stacks:  # fmt: skip
    """Exactly `allocs` cuMemAlloc_v2 calls (of `pid` when given, of the whole trace
    otherwise), each stack's depths 0, 1, 2, ...; returns each allocation's stack as its
    frames' `columns` (innermost first, in call order). Stack ids are per process."""
    calls = t.scan("cuda_calls").collect()
    stacks = t.scan("stacks").collect()
    if pid is not None:
        calls = calls.filter(calls["pid"] == pid)
        stacks = stacks.filter(stacks["pid"] == pid)
    alloc_ids = calls.filter(calls["func"] == "cuMemAlloc_v2")["stack_id"].to_list()
    assert len(alloc_ids) == allocs
    frames: dict[int, list[tuple[Any, ...]]] = {}
    rows = stacks.sort("stack_id", "depth")
    for sid, depth, *frame in rows.select("stack_id", "depth", *columns).rows():
        frames.setdefault(sid, []).append(tuple(frame))
        assert len(frames[sid]) == depth + 1
    return [frames[sid] for sid in alloc_ids]


def record_alloc_stacks(out: Path, args: list[str], allocs: int, columns: tuple[str, ...],
                        timeout: float) -> tuple[Any, Stacks, str]:  # fmt: skip
    """Record `args` (record options, `--`, a stand-in CUDA program and its arguments)
    into `out`, and check what every stack test relies on: exit 0, a complete trace,
    no drop, no stack error, exactly `allocs` cuMemAlloc_v2 calls, each stack's depths
    0, 1, 2, ... Returns the trace, each allocation's stack as its frames' `columns`
    (innermost first, in call order) and the program's stdout."""
    from gputrace.trace.reader import open_trace

    env = {k: v for k, v in os.environ.items() if k != "GPUTRACE_STANDIN_DEVDIR"}
    r = subprocess.run(record_cmd(out, *args), cwd=ROOT, capture_output=True, text=True,
                       timeout=timeout, env=env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    t = open_trace(out)
    check_stack_trace(t)
    return t, alloc_stacks(t, allocs, columns), r.stdout


class SharedRecording:
    """One `gputrace record` of several programs run one after another (a `sh -c`
    command, `set -e`), for tests that would each record their own program with the
    same options: each bcc compile costs about 12 s of CPU, the programs under it well
    under one. The trace is checked as every stack test checks it (check_stack_trace);
    `pids[name]` and `stdout[name]` are each program's, `paths` what the recording
    built (programs, libraries)."""

    def __init__(self, out: Path, programs: dict[str, list[str]], opts: list[str],
                 paths: dict[str, Path], timeout: float = RUN_S) -> None:  # fmt: skip
        import polars as pl

        from gputrace.trace.reader import open_trace

        logs = out.parent / f"{out.name}.stdout"
        logs.mkdir()
        lines = ["set -e"]
        for i, argv in enumerate(programs.values()):
            lines.append(" ".join(map(shlex.quote, argv)) + f" > {shlex.quote(str(logs / str(i)))}")
        env = {k: v for k, v in os.environ.items() if k != "GPUTRACE_STANDIN_DEVDIR"}
        r = subprocess.run(record_cmd(out, *opts, "--", "sh", "-c", "\n".join(lines)), cwd=ROOT,
                           capture_output=True, text=True, timeout=timeout, env=env)  # fmt: skip
        assert r.returncode == 0, r.stderr
        self.trace = open_trace(out)
        check_stack_trace(self.trace)
        # one after another: each program's first call comes after the previous one's last
        calls = self.trace.scan("cuda_calls").collect()
        firsts = calls.group_by("pid").agg(pl.col("ts_ns").min().alias("first")).sort("first")
        assert firsts.height == len(programs), firsts
        self.pids = dict(zip(programs, firsts["pid"].to_list(), strict=True))
        self.stdout = {name: (logs / str(i)).read_text() for i, name in enumerate(programs)}
        self.paths = paths


DLOPEN_TWIN_GROUP = "dlopen_twin_default_options"
"""The xdist_group of every test using the `dlopen_twin` fixture (tests/live/conftest.py)."""
API_STACKS_GROUP = "api_stacks_default_options"
"""The xdist_group of every test using the `api_stacks` fixture (tests/live/conftest.py):
one worker runs them all, so the recording is made once."""
STORM_WALK_CALLS = 30
"""Allocations of each stack-walk storm (tests/live/test_record_stack_walk.py)."""
STORM_WALK_DEPTHS = (0, 40, "40b")
STORM_DEPTH_CALLS, STORM_DEPTH = 50, 60
"""The --stack-depth test's storm: CALLS allocations DEPTH frames of descend() below
main, a framework's deep stack (tests/live/test_record_stack_depth.py)."""
CACHING_SEGMENTS = 3
"""Segments the stand-in caching allocator grows (tests/live/test_record_unwind.py)."""


def record_api_stacks(tmp: Path) -> SharedRecording:
    """The API-layer stack programs recorded with default options, one recording for
    all (names are the keys of `pids` and `stdout`): storm.c at each stack-walk depth
    ("walk-0", "walk-40", "walk-40b") and at the --stack-depth test's depth
    ("depth-full") and the stand-in caching allocator ("caching"). (The Python
    interpreter-exit test keeps its own recording: an interpreter built without frame
    pointers gets unwind tables, and the unwinder test asserts the caching library's
    table is the recording's only one.)"""
    from tests.standin_cuda.standin_cuda import build

    paths = build()
    storm = storm_program(tmp)
    caching = paths.lib_dir / "caching_program"
    programs = {f"walk-{d}": [str(storm), str(STORM_WALK_CALLS), "-", str(d)]
                for d in STORM_WALK_DEPTHS}  # fmt: skip
    programs["depth-full"] = [str(storm), str(STORM_DEPTH_CALLS), "-", str(STORM_DEPTH)]
    programs["caching"] = [str(caching), str(CACHING_SEGMENTS)]
    built = {"storm": storm, "caching": caching,
             "caching_lib": paths.lib_dir / "libcaching_standin.so"}  # fmt: skip
    return SharedRecording(tmp / "trace", programs, [], built)


PY_WORKLOAD = ROOT / "tests" / "standin_cuda" / "py_workload.py"


def record_py_workload(out: Path, exe: str | Path, *args: str) -> int:
    """Record tests/standin_cuda/py_workload.py under interpreter `exe` with `-p` into
    `out` (`record_waiting_program`); returns the workload's pid."""
    from tests.standin_cuda.standin_cuda import build

    return record_waiting_program(
        out, [str(exe), str(PY_WORKLOAD), str(build().libcuda), "--wait", *args])


def record_waiting_program(out: Path, cmd: list[str]) -> int:
    """Record `cmd`, a program of the READY/go/ALLOCATED/bye protocol (py_workload.py,
    py_mid.py), with `-p` into `out`, stopping the recorder while the program still
    lives (its code objects are named at the drain); returns the program's pid."""
    w = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert w.stdin is not None and w.stdout is not None
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
    return w.pid


PYENV = Path("/root/.pyenv/versions")
INTERPRETERS = {
    "3.10": PYENV / "3.10.13" / "bin" / "python",
    "3.11": PYENV / "3.11.7" / "bin" / "python",
    "3.12": PYENV / "3.12.1" / "bin" / "python",
    "3.13": PYENV / "3.13.0" / "bin" / "python",
    "debian-3.11": Path("/usr/bin/python3"),
}
"""The interpreters the Python-frame live tests record (pyenv's and Debian's)."""
