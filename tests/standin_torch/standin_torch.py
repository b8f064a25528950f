"""TEST STAND-IN helpers: build the stand-in libc10_cuda.so and record its workload.

Not PyTorch code (README.md). `build()` makes tests/standin_cuda first (the stand-in
libcuda it calls), then tests/standin_torch/build/libc10_cuda.so.
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tests.standin.standin import locked_make

HERE = Path(__file__).resolve().parent
LIB = HERE / "build" / "libc10_cuda.so"
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
    stderr: str = ""


def record(out: Path, exe: str, *args: str, record_args: tuple[str, ...] = (),
           env: dict[str, str] | None = None) -> Run:
    """Record the workload (interpreter `exe`) with `-p` into `out`: started and
    waiting, the recorder attached, then its calls; the recorder stopped while
    the workload still lives (its code objects are named at the drain)."""
    from tests.record_helpers import RecorderProc, record_cmd

    w = subprocess.Popen([exe, str(WORKLOAD), str(build()), "--wait", *args],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         env={**os.environ, **(env or {})})  # fmt: skip
    assert w.stdin is not None and w.stdout is not None
    run = Run(w.pid)
    try:
        assert w.stdout.readline() == f"READY {w.pid}\n"
        rec = RecorderProc(record_cmd(out, "-p", str(w.pid), *record_args))
        rec.wait_ready()
        w.stdin.write("go\n")
        w.stdin.flush()
        while (line := w.stdout.readline()) != "ALLOCATED\n":
            assert line, "the workload ended early"
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
        rec.proc.send_signal(signal.SIGINT)
        code = rec.wait()
        run.stderr = "".join(rec.stderr)
        assert code == 0, run.stderr
        w.stdin.write("bye\n")
        w.stdin.flush()
        assert w.stdout.readline() == "DONE\n"
    finally:
        w.kill()
        w.wait()
    return run
