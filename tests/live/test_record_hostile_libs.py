"""A traced process that opens and maps hostile ELF files (tests/hostile_elf.py,
SYNTHETIC) costs the root recorder and its compile worker bounded memory and time,
and the trace completes with the reasons in its manifest (root, bcc).

The process loads the stand-in libcuda, maps an unwind-row bomb executable (one FDE
of 2 million rows: 65 s and 1.97 GiB in the worker before the bounds), then, once the
recorder is attached, opens a symbol-name bomb named libcuda.so.1 (1,000 names into
one NUL-free 8 MiB string table: ~8 GiB in the recorder, which was OOM-killed in a
3 GiB cgroup and left the trace "recording") and allocates through the real one.
A watcher reads the peak resident memory (VmHWM) of the recorder and every process
under it while it runs, and ends them all past KILL_AT (the test then fails).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gputrace.record import reap
from gputrace.trace.reader import open_trace
from tests import hostile_elf
from tests.record_helpers import RecorderProc, live_skip_reason, record_cmd

pytestmark = [pytest.mark.live]
_SKIP = live_skip_reason()
if _SKIP is not None:
    pytestmark.append(pytest.mark.skip(reason=_SKIP))

MAX_RSS = 1536 << 20  # the recorder (bcc, LLVM: ~0.5-1 GiB here) or its worker, at peak
KILL_AT = 3 << 30  # the watcher ends the recording past this (the old parsers: 8 GiB)
MAX_RUN_S = 60.0  # from "go" to the recorder's exit, on 2 shared CPUs

PROGRAM = """
import ctypes, mmap, os, sys
real, rows, bomb = sys.argv[1:4]
lib = ctypes.CDLL(real)
dev, ctx = ctypes.c_int(0), ctypes.c_void_p(0)
assert not (lib.cuInit(0) or lib.cuDeviceGet(ctypes.byref(dev), 0)
            or lib.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev))
f = open(rows, "rb")
m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ | mmap.PROT_EXEC)
print("READY", os.getpid(), flush=True)
sys.stdin.readline()
os.close(os.open(bomb, os.O_RDONLY))  # a libcuda load to the probes: attached to
ptr = ctypes.c_ulonglong(0)
assert lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(1 << 20)) == 0
print("ALLOCATED", flush=True)
sys.stdin.readline()
"""


class Watcher(threading.Thread):
    """Peak VmHWM of `pid` and its descendants, polled; ends them past KILL_AT, and
    the traced process `target` (the recorder's watchdog, ended too, cannot let it go
    from a stop)."""

    def __init__(self, pid: int, target: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.target, self.peak, self.killed = pid, target, {}, False
        self.done = threading.Event()

    def tree(self) -> list[int]:
        out, todo = [], [self.pid]
        while todo:
            p = todo.pop()
            out.append(p)
            try:
                for t in os.listdir(f"/proc/{p}/task"):
                    todo += [int(c) for c in Path(f"/proc/{p}/task/{t}/children")
                             .read_text().split()]  # fmt: skip
            except OSError:
                pass
        return out

    def run(self) -> None:
        while not self.done.wait(0.02):  # a poll with a stop flag, not a timing sleep
            for p in self.tree():
                try:
                    text = Path(f"/proc/{p}/status").read_text()
                except OSError:
                    continue
                for line in text.splitlines():
                    if line.startswith("VmHWM:"):
                        self.peak[p] = max(self.peak.get(p, 0), int(line.split()[1]) << 10)
                if self.peak.get(p, 0) > KILL_AT:
                    self.killed = True
                    for q in [*self.tree(), self.target]:
                        with_kill(q)


def wait_skipped(trace: Path, module: str, deadline: float) -> str:
    """The reason the recorder's manifest gives for `module`'s unwind table, once it
    gives one (polled until `deadline`: the manifest is rewritten at each rotation)."""
    while True:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            doc = json.loads((trace / "manifest.json").read_text())
            for s in doc["api"]["unwind"]["skipped"]:
                if s["module"] == module:
                    return str(s["reason"])
        assert time.monotonic() < deadline, f"{module}: no verdict from the recorder"
        time.sleep(0.1)  # polling a file with a deadline


def with_kill(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


def test_hostile_libraries_cost_bounded_memory_and_time(tmp_path: Path) -> None:
    from tests.standin_cuda.standin_cuda import build

    lib = tmp_path / "lib"
    lib.mkdir()
    rows = hostile_elf.row_bomb(lib / "librowbomb.so")
    bomb = hostile_elf.symbol_bomb(lib / "libcuda.so.1", symbols=1000, strtab=8 << 20)
    w = subprocess.Popen([sys.executable, "-c", PROGRAM, str(build().libcuda), str(rows),
                          str(bomb)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)  # fmt: skip
    assert w.stdin is not None and w.stdout is not None
    out = tmp_path / "trace"
    watch: Watcher | None = None
    try:
        assert w.stdout.readline() == f"READY {w.pid}\n"
        rec = RecorderProc(record_cmd(out, "-p", str(w.pid)))
        watch = Watcher(rec.proc.pid, w.pid)
        watch.start()
        rec.wait_ready()
        t0 = time.monotonic()
        w.stdin.write("go\n")
        w.stdin.flush()
        assert w.stdout.readline() == "ALLOCATED\n", watch.peak
        # the recorder says it refused the row bomb (the manifest of a rotation)
        skipped = wait_skipped(out, str(rows), t0 + MAX_RUN_S)
        rec.proc.send_signal(signal.SIGINT)
        assert rec.wait(timeout=MAX_RUN_S * 2) == 0, "".join(rec.stderr)
        took = time.monotonic() - t0
    finally:
        if watch is not None:
            watch.done.set()
        w.kill()
        w.wait()
    assert watch is not None and not watch.killed, watch.peak
    assert max(watch.peak.values()) < MAX_RSS, watch.peak
    assert took < MAX_RUN_S
    t = open_trace(out)
    assert t.manifest["status"] == "complete"
    api = t.manifest["api"]
    # the bomb was parsed with its names cut: attached to, its cu* symbols absent
    assert str(bomb) in api["libraries"]
    assert {"name": f"uprobe:cuMemAlloc_v2@{bomb}", "reason": "symbol not exported"} in (
        t.manifest["hooks"]["skipped"])
    assert "over the bound of 65536 bytes" in skipped, skipped
    assert {"module": str(rows), "reason": skipped} in api["unwind"]["skipped"]
    assert "helpers_left" not in t.manifest


FIFO_PROGRAM = """
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_NONBLOCK)  # no writer: never one
print("OPENED", flush=True)
sys.stdin.readline()
"""


def test_a_fifo_named_libcuda_does_not_hold_the_recorder(tmp_path: Path) -> None:
    """A traced process opens a FIFO named libcuda.so.1 (read-only: no writer). The
    recorder attaches to the libcuda a process opens; a blocking open of that FIFO
    for reading would wait for a writer forever (SIGINT and SIGTERM retry it), with
    the process stopped for the attach. The recorder must refuse it at once, finish
    the trace, and say why in the manifest."""
    fifo = tmp_path / "lib" / "libcuda.so.1"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    out = tmp_path / "trace"
    rec = RecorderProc(record_cmd(out, "--", sys.executable, "-c", FIFO_PROGRAM, str(fifo)),
                       stdin=subprocess.PIPE)  # fmt: skip
    skip = {"name": f"uprobe:*@{fifo}", "reason": f"{fifo}: not a regular file"}
    assert rec.proc.stdin is not None and rec.proc.stdout is not None
    try:
        rec.wait_ready()
        assert rec.proc.stdout.readline() == "OPENED\n"
        deadline = time.monotonic() + MAX_RUN_S
        while skip not in hooks_skipped(out):  # the recorder looked at it and went on
            assert time.monotonic() < deadline, "".join(rec.stderr)
            time.sleep(0.1)  # polling a file with a deadline
        rec.proc.stdin.write("\n")
        rec.proc.stdin.flush()
        rc = rec.wait(timeout=MAX_RUN_S)
    finally:
        if rec.proc.poll() is None:
            rec.proc.kill()
            rec.proc.wait()
    assert rc == 0, "".join(rec.stderr)
    t = open_trace(out)
    assert t.manifest["status"] == "complete"
    assert skip in t.manifest["hooks"]["skipped"]


def hooks_skipped(trace: Path) -> list[dict[str, str]]:
    """The manifest's hooks.skipped as last written (empty while none is readable)."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        return list(json.loads((trace / "manifest.json").read_text())["hooks"]["skipped"])
    return []


FUSE_PROGRAM = """
import ctypes, mmap, os, sys
real, lib = sys.argv[1:3]
cuda = ctypes.CDLL(real)
dev, ctx = ctypes.c_int(0), ctypes.c_void_p(0)
assert not (cuda.cuInit(0) or cuda.cuDeviceGet(ctypes.byref(dev), 0)
            or cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev))
f = open(lib, "rb")
m = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE,
              prot=mmap.PROT_READ | mmap.PROT_EXEC)
ptr = ctypes.c_ulonglong(0)
assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(1 << 20)) == 0
print("MAPPED", flush=True)
sys.stdin.readline()
"""


def _ppid(pid: int) -> int | None:
    """The parent of `pid`, None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("PPid:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def test_a_compile_worker_stuck_in_a_hostile_close_is_named_in_the_manifest(
        tmp_path: Path) -> None:
    """A traced process maps a library of its own FUSE filesystem whose server never
    answers the compile worker's FLUSH: the worker's close of it sleeps
    uninterruptibly (beyond SIGKILL). The recording still ends at once, complete, and
    its manifest and stderr name the worker left to the kernel, its pid and state D."""
    from tests.standin import standin
    from tests.standin_cuda.standin_cuda import build

    if (why := standin.skip_reason()) is not None:
        pytest.skip(why)
    honest = hostile_elf.honest(tmp_path / "libhonest.so", functions=10)
    out = tmp_path / "trace"
    # the worker is a multiprocessing child: its command line holds spawn_main
    with standin.noflush_mount(tmp_path, content=honest, hang="spawn_main") as hostile:
        w = subprocess.Popen([sys.executable, "-c", FUSE_PROGRAM, str(build().libcuda),
                              str(hostile.file)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert w.stdin is not None and w.stdout is not None
        rec = RecorderProc(record_cmd(out, "--no-cache", "-p", str(w.pid)))
        try:
            rec.wait_ready()
            assert w.stdout.readline() == "MAPPED\n"
            deadline = time.monotonic() + MAX_RUN_S
            # Ours is the recorder's child; a host-mode recorder of another test that saw
            # the mapping compiles the library too, and its worker hangs the same way.
            while not (hung := [p for p in set(hostile.hung_pids())
                                if _ppid(p) == rec.proc.pid]):
                assert time.monotonic() < deadline, hostile.log.read_text()
                time.sleep(0.05)  # polling a log with a deadline
            assert len(hung) == 1, {p: Path(f"/proc/{p}/cmdline").read_bytes()[:100]
                                    for p in hung}  # fmt: skip
            worker = hung[0]
            t0 = time.monotonic()
            rec.proc.send_signal(signal.SIGINT)
            rc = rec.wait(timeout=MAX_RUN_S)
            took = time.monotonic() - t0
            stuck = reap.held_state(worker)  # while the hostile server still runs
        finally:
            w.kill()
            w.wait()
            if rec.proc.poll() is None:
                rec.proc.kill()
    rec.proc.wait()
    assert rc == 0, "".join(rec.stderr)
    assert worker != rec.proc.pid and stuck == "D", stuck
    assert took < MAX_RUN_S
    m = open_trace(out).manifest
    assert m["status"] == "complete"
    why = f"asleep uninterruptibly after SIGKILL and {reap.REAP_WAIT_S:g} s"
    assert m["helpers_left"] == [{"helper": "unwind compile worker", "pid": worker,
                                  "state": "D", "why": why}]  # fmt: skip
    assert (f"gputrace: warning: the unwind compile worker (pid {worker}) could not be "
            f"ended: {why}; it is left to the kernel (it holds no part of the trace)\n"
            in rec.stderr), rec.stderr
