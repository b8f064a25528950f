"""What the API-layer benchmarks (alloc_storm, alloc_loop) share: a program
built against the stand-in libcuda, run untraced, under the bare uprobe floor
(empty uprobe + uretprobe programs on the calls it makes) or under `gputrace
record -p` of some tree."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from revision import start_recorder_from

T = TypeVar("T")

SYMS = ("cuMemAlloc_v2", "cuMemFree_v2")
Result = tuple[float, float]  # CPU ns per allocation, per free
_FLOOR = "int on_entry(void *ctx) { return 0; }\nint on_return(void *ctx) { return 0; }\n"


def build(source: Path, exe: Path) -> tuple[Path, Path]:
    """`source` linked against the stand-in libcuda: (executable, libcuda path)."""
    from tests.standin_cuda.standin_cuda import build as build_standin
    from tests.standin_cuda.standin_cuda import link_program

    return link_program(source, exe), build_standin().libcuda


def env() -> dict[str, str]:
    """The environment of the program: no stand-in device folder (pure bookkeeping)."""
    e = dict(os.environ)
    e.pop("GPUTRACE_STANDIN_DEVDIR", None)
    return e


def untraced(argv: list[str]) -> str:
    """The program's stdout, run alone."""
    return subprocess.run(argv, capture_output=True, text=True, check=True, env=env()).stdout


def under_uprobe_floor(lib: Path, work: Callable[[], T]) -> T:
    """`work()` while empty programs sit on SYMS' uprobes and uretprobes in `lib`:
    what the kernel's uprobes cost whatever a tracer does."""
    from gputrace.record import loader

    bpf = loader.import_bcc().BPF(text=_FLOOR)
    try:
        for sym in SYMS:
            bpf.attach_uprobe(name=str(lib), sym=sym, fn_name="on_entry")
            bpf.attach_uretprobe(name=str(lib), sym=sym, fn_name="on_return")
        return work()
    finally:
        bpf.cleanup()


def traced(argv: list[str], tree: Path | None, out: Path, *flags: str) -> tuple[str, Any]:
    """The program (argv in its --wait mode: it prints "READY PID" and waits for a
    line) under `gputrace record -p PID FLAGS` of `tree`: (its stdout, the trace)."""
    from gputrace.trace.reader import open_trace

    w = subprocess.Popen(argv, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         env=env())  # fmt: skip
    assert w.stdout is not None and w.stdin is not None
    pid = int(w.stdout.readline().split()[1])
    rec = start_recorder_from(tree, out, "-p", str(pid), *flags).proc
    w.stdin.write("go\n")
    w.stdin.flush()
    stdout = w.communicate()[0]
    rec.wait()
    return stdout, open_trace(out)


def parse(out: str) -> Result:
    """The storm programs' result line (api_program.h): CPU ns per allocation, per free."""
    for line in out.splitlines():
        if line.startswith("calls "):
            f = line.split()
            return float(f[7]), float(f[9])
    raise RuntimeError(f"no result in {out!r}")
