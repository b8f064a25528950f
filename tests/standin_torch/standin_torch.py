"""TEST STAND-IN helpers: build the stand-in libc10_cuda.so and record its workload.

Not PyTorch code (README.md). `build()` makes tests/standin_cuda first (the stand-in
libcuda it calls), then tests/standin_torch/build/libc10_cuda.so.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.standin.standin import locked_make

HERE = Path(__file__).resolve().parent
LIB = HERE / "build" / "libc10_cuda.so"  # 2.14's shape
LIB_2_5 = HERE / "build" / "v2.5" / "libc10_cuda.so"  # 2.5's: free inlined in its callers
LIB_2_1 = HERE / "build" / "v2.1" / "libc10_cuda.so"  # 2.1's: as 2.5, malloc(void**, int, ..)
LIB_UNKNOWN = HERE / "build" / "unknown" / "libc10_cuda.so"  # malloc(.., bool): no table
WORKLOAD = HERE / "torch_workload.py"


class StandinTorchUnavailable(RuntimeError):
    """g++ or make is missing, or the build failed."""


def build() -> Path:
    """The stand-in libc10_cuda.so (built when needed)."""
    from tests.standin_cuda.standin_cuda import build as build_cuda

    build_cuda()
    r = locked_make(HERE, [])
    if r is not None and r.returncode != 0:
        raise StandinTorchUnavailable(f"building the libc10_cuda stand-in failed:\n"
                                      f"{r.stdout}{r.stderr}")
    return LIB


def plant_line(marker: str) -> int:
    """The workload's line that carries `# PLANT: marker`."""
    lines = WORKLOAD.read_text().splitlines()
    return next(i for i, x in enumerate(lines, 1) if x.endswith(f"# PLANT: {marker}"))


@dataclass
class Run:
    """What the workload said it did (its T/F/OOM lines) and the recorder's stderr."""

    pid: int
    tensors: list[tuple[int, int, str]] = field(default_factory=list)  # (ptr, size, where)
    freed: list[int] = field(default_factory=list)
    ooms: list[int] = field(default_factory=list)
    reserved: int = 0
    allocated: int = 0
    pages: tuple[int, int] = (0, 0)  # expandable segments' pages mapped, unmapped
    pending: int = 0  # bytes freed and held for another stream at the end
    stderr: str = ""


def record(out: Path, exe: str, *args: str, record_args: tuple[str, ...] = (),
           env: dict[str, str] | None = None, lib: Path | None = None) -> Run:
    """Record the workload (interpreter `exe`, library `lib`: the 2.14-shaped
    stand-in by default) with `-p` into `out`; see `record_many`."""
    return record_many(out, [(exe, lib or build(), args)], record_args, env)[0]


Workload = tuple[str, Path, tuple[str, ...]] | tuple[str, Path, tuple[str, ...], dict[str, str]]


def record_many(out: Path, workloads: list[Workload],
                record_args: tuple[str, ...] = (), env: dict[str, str] | None = None,
                while_alive: Callable[[], None] | None = None) -> list[Run]:
    """Record workloads (interpreter, libc10_cuda, arguments[, their own environment])
    with `-p` into `out`:
    each started and waiting, the recorder attached, then their calls; the recorder
    stopped while they still live (code objects are named at the drain), then
    `while_alive()`, then they end."""
    from tests.record_helpers import RecorderProc, record_cmd

    build()
    procs = [subprocess.Popen([w[0], str(WORKLOAD), str(w[1]), "--wait", *w[2]],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, **(env or {}), **(w[3] if len(w) > 3 else {})})
             for w in workloads]  # fmt: skip
    runs = [Run(w.pid) for w in procs]
    try:
        for w in procs:
            assert w.stdout is not None and w.stdout.readline() == f"READY {w.pid}\n"
        pids = [a for w in procs for a in ("-p", str(w.pid))]
        rec = RecorderProc(record_cmd(out, *pids, *record_args))
        rec.wait_ready()
        for w, run in zip(procs, runs, strict=True):
            assert w.stdin is not None and w.stdout is not None
            w.stdin.write("go\n")
            w.stdin.flush()
            while (line := w.stdout.readline()) != "ALLOCATED\n":
                assert line, "the workload ended early"
                _said(run, line)
        rec.proc.send_signal(signal.SIGINT)
        code = rec.wait()
        for run in runs:
            run.stderr = "".join(rec.stderr)
        assert code == 0, runs[0].stderr
        if while_alive is not None:
            while_alive()
        for w in procs:
            assert w.stdin is not None and w.stdout is not None
            w.stdin.write("bye\n")
            w.stdin.flush()
            assert w.stdout.readline() == "DONE\n"
    finally:
        for w in procs:
            w.kill()
            w.wait()
    return runs


def _said(run: Run, line: str) -> None:
    word, *rest = line.split()
    if word == "T":
        run.tensors.append((int(rest[0]), int(rest[1]), rest[2]))
    elif word == "F":
        run.freed.append(int(rest[0]))
    elif word == "OOM":
        run.ooms.append(int(rest[0]))
    elif word == "RESERVED":
        run.reserved = int(rest[0])
    elif word == "ALLOCATED_BYTES":
        run.allocated = int(rest[0])
    elif word == "PAGES":
        run.pages = (int(rest[0]), int(rest[1]))
    elif word == "PENDING":
        run.pending = int(rest[0])


def block_round(n: int) -> int:
    """PyTorch's block rounding (computed here, not imported from the layer)."""
    return max(512, (n + 511) // 512 * 512)


def analyze_json(trace: Path, only: str) -> dict[str, Any]:
    """`gputrace analyze TRACE --only ONLY --format json`, run as a user runs it."""
    import json
    import sys

    from tests.record_helpers import ROOT

    r = subprocess.run([sys.executable, "-m", "gputrace.cli", "analyze", str(trace), "--only",
                        only, "--format", "json"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert r.returncode == 0, r.stderr
    out: dict[str, Any] = json.loads(r.stdout)
    return out
