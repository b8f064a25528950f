"""Unwind tables in the API probe's maps (probes/cuda_unwind.bpf.h).

A library gets a table when it is mapped executable by a traced process and
its call frame information shows it was built without frame pointers (fewer
than half of its functions move the CFA to %rbp): there the frame-pointer walk
loses frames; elsewhere it is right and cheaper, and stays. The C library and
the dynamic loader get none: their frames are the outermost of a stack
(__libc_start_call_main, start_thread), where walks end as before. A table is
compiled once per file (device, inode) and its rows stored once in
`unwind_rows`, shared by every process mapping it; `unwind_procs` holds each
process's mappings with a table (at most MAPS). Bounds: TABLE_ROWS rows per
library, ROWS in all; a library over them is walked by frame pointers and
listed in the manifest with the reason.

When a process maps more such libraries than it has slots, the slots go by use:
the interpreter first (a CPython process's Python frames are merged at its eval
loop, so every stack passes through it), then the libraries its recorded stacks
have shown frames in (a walk that ends in a library without a table shows the
frame that entered it), in the order first seen, then the rest in address order.
A library first seen on a stack takes the slot of one never seen there.
"""

from __future__ import annotations

import bisect
import concurrent.futures as cf
import contextlib
import ctypes
import multiprocessing
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gputrace.record import elf, reap
from gputrace.record.api.symbolize import Mapping
from gputrace.record.python_stacks.process import INTERPRETER_NAME
from gputrace.record.unwind import cache, cfi

ROWS = 1 << 18  # rows of all tables together (GT_UNWIND_ROWS)
TABLE_ROWS = 1 << 16  # rows of one table: GT_UNWIND_SEARCH binary-search steps
MAPS = 8  # mappings with a table per process (GT_UNWIND_MAPS)
# frames unwound by tables at the top of a stack (GT_UNWIND_FRAMES) when the
# whole-stack walk cannot run: the verifier follows each, and 8 keeps the
# program under its 1M-instruction limit
FRAMES = 8
WALK_ENV = "GPUTRACE_UNWIND_WALK"
TAIL_STEP, TAIL_BACK = 0, 1  # unwind_tails slots (GT_UNWIND_TAIL_*)
# frames per tail-called step of the whole-stack walk (GT_UNWIND_STEP)
STEP = 8
# walks end in these, as before the unwinder: no table
_OUTERMOST = ("libc.so", "ld-linux", "ld64.so")
CROWDED = f"more than {MAPS} tables in one process"
PAUSE_WAIT_S = 0.5
"""The most a process stopped at its libcuda load or first call waits for its tables:
those compiled by then walk that call; the rest are loaded when they are ready."""
START_WAIT_S = 5.0
"""The most the recorder waits at start for the tables of the processes running then
(before it says it records: their first recorded allocation is walked whole)."""


class Compiler:
    """Compiles tables in one worker process, in the order asked. pyelftools is pure
    Python: a library takes up to seconds (~2 s for one over TABLE_ROWS on the
    benchmarks' VM, refused early) and a PyTorch process maps dozens, which in the
    recorder would hold a stopped process for minutes (seen on the H200) and its
    ring buffers undrained; in a worker they hold neither."""

    def __init__(self) -> None:
        self.pool: cf.ProcessPoolExecutor | None = None
        self.cache_dir: Path | None = None  # decided once, at start: the worker's too
        self.closed = False

    def start(self) -> None:
        """Start the worker now (a spawned interpreter importing pyelftools: a few
        hundred ms), not at the first library."""
        if self.pool is None:
            self.cache_dir = cache.cache_dir()
            # spawn, never fork: the recorder holds BPF programs, maps and threads
            self.pool = cf.ProcessPoolExecutor(
                1, mp_context=multiprocessing.get_context("spawn"),
                initializer=cfi.worker_init, initargs=(os.getpid(),))
            self.pool.submit(cfi.warm)

    def submit(self, path: str) -> cf.Future[cfi.UnwindTable]:
        if self.closed:  # the recording ended: no worker is started again
            done: cf.Future[cfi.UnwindTable] = cf.Future()
            done.set_exception(cfi.CfiError(f"{path}: not compiled (the recording ended)"))
            return done
        if self.pool is not None and getattr(self.pool, "_broken", False):
            # the worker died (a library took it past its memory cap, or someone killed
            # it): its compiles failed with the reason; a new one takes the next
            self._end_pool()
        self.start()
        assert self.pool is not None
        return self.pool.submit(cache.compile_cached, path, TABLE_ROWS, self.cache_dir)

    def close(self) -> None:
        """Stop now: queued libraries dropped, the worker killed and reaped whatever
        it is doing (`reap.end`: one the kernel holds is said, not waited for)."""
        self.closed = True
        self._end_pool()

    def _end_pool(self) -> None:
        if self.pool is None:
            return
        procs = list(getattr(self.pool, "_processes", {}).values())
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.pool = None
        for proc in procs:
            reap.end("unwind compile worker", proc.pid, proc.kill, _joiner(proc))


def _joiner(proc: Any) -> Callable[[float], bool]:
    """Has the worker `proc` ended within a timeout (joined)?"""
    def joined(timeout: float) -> bool:
        proc.join(timeout)
        return proc.exitcode is not None
    return joined


def cflags() -> list[str]:
    """The table bounds the BPF program is compiled with (numbers only)."""
    return [f"-DGT_UNWIND_ROWS={ROWS}", f"-DGT_UNWIND_FRAMES={FRAMES}",
            f"-DGT_UNWIND_STEP={STEP}"]


NOT_STARTED = "none (no libcuda probed)"
"""`walk` until the first libcuda is attached (LibcudaProbes.attach starts the walker)."""


def start_walker(bcc: Any, bpf: Any) -> str:
    """Put the whole-stack walk's programs in `unwind_tails`: the step, and the
    uretprobe it returns to (the same program its probes run). Returns how
    stacks in processes with tables are walked, for the manifest: "whole stack"
    or, when the step cannot load, "top frames" and why. WALK_ENV=top keeps
    the top-frames walk (benchmarks/unwind_storm compares the two)."""
    if os.environ.get(WALK_ENV) == "top":
        return f"top frames ({WALK_ENV}=top)"
    try:
        back = bpf.load_func(b"uretprobe_cuda", bcc.BPF.KPROBE)
        step = bpf.load_func(b"unwind_step", bcc.BPF.KPROBE)
    except Exception as e:  # bcc raises a bare Exception with the verifier's verdict
        return f"top frames ({str(e).splitlines()[0][:200]})"
    tails = bpf[b"unwind_tails"]
    # the way back first: a step that runs has somewhere to return
    tails[ctypes.c_int(TAIL_BACK)] = ctypes.c_int(back.fd)
    tails[ctypes.c_int(TAIL_STEP)] = ctypes.c_int(step.fd)
    return "whole stack"


@dataclass
class _Compile:
    """A file being compiled: the path shown, the path the worker was given (through
    /proc/PID/root), and the processes whose mappings wait for it."""

    future: cf.Future[cfi.UnwindTable]
    path: str
    candidate: str
    pids: set[int] = field(default_factory=set)


@dataclass
class _Table:
    row: int  # first row in unwind_rows
    rows: int


@dataclass
class UnwindTables:
    """Tables loaded into one API program's maps, and what each process uses."""

    bpf: Any
    walk: str = "top frames"  # start_walker's verdict
    compiler: Compiler = field(default_factory=Compiler)
    used: int = 0
    by_file: dict[tuple[int, int], _Table | None] = field(default_factory=dict)
    compiling: dict[tuple[int, int], _Compile] = field(default_factory=dict)
    loaded: dict[str, int] = field(default_factory=dict)  # module -> rows (manifest)
    skipped: dict[str, str] = field(default_factory=dict)  # module -> why no table
    procs: dict[int, tuple[tuple[int, int, int, int, int], ...]] = field(default_factory=dict)
    seen: dict[int, list[Mapping]] = field(default_factory=dict)  # the maps last given
    # pid -> paths its stacks showed frames in, in the order first seen
    on_stacks: dict[int, dict[str, None]] = field(default_factory=dict)
    # pid -> (starts, ends, paths) of its mappings with a table, by start
    tabled: dict[int, tuple[list[int], list[int], list[str]]] = field(default_factory=dict)
    slotted: dict[int, set[str]] = field(default_factory=dict)  # pid -> paths with a slot
    crowded: dict[str, set[int]] = field(default_factory=dict)  # path -> pids left out

    def update(self, pid: int, maps: list[Mapping], wait_s: float = 0.0) -> None:
        """Give `pid`'s mappings of libraries without frame pointers their tables
        (nothing to do when they are the same list as last time: the symbolizer
        makes a new one each time it reads /proc/PID/maps). Tables not compiled yet
        are asked for; up to `wait_s` is spent waiting for them."""
        if self.seen.get(pid) is maps:
            return
        self.seen[pid] = maps
        self._assign(pid, maps)
        if wait_s > 0:
            self.poll(wait_s)

    def poll(self, wait_s: float = 0.0) -> bool:
        """Load the tables compiled since (waiting up to `wait_s` for those asked
        for) and give them to the processes mapping them. True when any came."""
        if not self.compiling:
            return False
        if wait_s > 0:
            cf.wait([c.future for c in self.compiling.values()], timeout=wait_s)
        done = [ino for ino, c in self.compiling.items() if c.future.done()]
        asked: set[int] = set()
        for ino in done:
            c = self.compiling.pop(ino)
            self.by_file[ino] = self._install(c.path, c.candidate, c.future, ino)
            asked |= c.pids
        for pid in sorted(asked):  # the processes mapping them: ranked again
            if pid in self.seen:
                self._assign(pid, self.seen[pid])
        return bool(done)

    def saw_stack(self, pid: int, ips: list[int]) -> None:
        """A recorded stack of `pid`: a library without a slot that it shows a frame
        in takes one (the next walk goes through it)."""
        found = self.tabled.get(pid)
        if not found or pid not in self.seen:
            return
        starts, ends, paths = found
        seen = self.on_stacks.setdefault(pid, {})
        new = False
        for ip in ips:
            i = bisect.bisect_right(starts, ip) - 1
            if i >= 0 and ip < ends[i] and paths[i] not in seen:
                seen[paths[i]] = None  # a library with a slot counts as used too
                new = new or paths[i] not in self.slotted.get(pid, ())
        if new:
            self._assign(pid, self.seen[pid])

    def _assign(self, pid: int, maps: list[Mapping]) -> None:
        """The slots of `pid`, by use (the module docstring), into `unwind_procs`."""
        used = list(self.on_stacks.get(pid, {}))
        wanted: list[tuple[int, int, str, Mapping]] = []
        for order, m in enumerate(maps):
            path = m.path.removesuffix(" (deleted)")
            if not path.startswith("/") or os.path.basename(path).startswith(_OUTERMOST):
                continue
            rank = (0 if INTERPRETER_NAME.match(os.path.basename(path)) else
                    1 + used.index(path) if path in used else 1 + len(used) + order)
            wanted.append((rank, order, path, m))
        wanted.sort(key=lambda w: (w[0], w[1]))  # compiled in this order too
        ranked: list[tuple[int, int, str, tuple[int, int, int, int, int]]] = []
        for rank, order, path, m in wanted:
            found = self._for_file(pid, path, m.pgoff)
            if found is None:
                continue
            table, link_start = found
            ranked.append((rank, order, path, (m.start, m.end, m.start - link_start,
                                               table.row, table.rows)))
        self.slotted[pid] = {path for _r, _o, path, _e in ranked[:MAPS]}
        for path in self.slotted[pid]:
            self.crowded.get(path, set()).discard(pid)
        for _r, _o, path, _e in ranked[MAPS:]:
            self.crowded.setdefault(path, set()).add(pid)
        every = sorted((e[0], e[1], path) for _r, _o, path, e in ranked)
        self.tabled[pid] = ([x[0] for x in every], [x[1] for x in every], [x[2] for x in every])
        entries = sorted(e for _r, _o, _p, e in ranked[:MAPS])
        key = tuple(entries)
        if self.procs.get(pid) == key:
            return
        self.procs[pid] = key
        self._store_proc(pid, entries)

    def _for_file(self, pid: int, path: str, pgoff: int) -> tuple[_Table, int] | None:
        """The file's table and the link-time address of the mapping's first byte;
        None when it gets none, or none yet (asked for on first sight)."""
        for candidate in (f"/proc/{pid}/root{path}", path):
            try:  # one open: the identity and the headers read are one file's
                fd = elf.open_ro(candidate, nofollow=True)
                break
            except OSError:
                continue
        else:
            return None
        try:
            st = os.fstat(fd)
            ino = (st.st_dev, st.st_ino)
            if ino not in self.by_file:
                if ino not in self.compiling:
                    self.compiling[ino] = _Compile(self.compiler.submit(candidate), path,
                                                   candidate)
                self.compiling[ino].pids.add(pid)
                return None
            table = self.by_file[ino]
            if table is None:
                return None
            return table, elf.read(candidate, symbols=False, fd=fd).vaddr(pgoff)
        except (OSError, elf.ElfError):
            return None
        finally:
            os.close(fd)

    def _install(self, path: str, candidate: str, fut: cf.Future[cfi.UnwindTable],
                 ino: tuple[int, int] = (0, 0)) -> _Table | None:
        """A finished compile's rows into `unwind_rows`; None when it gives none (or
        the worker read another file than the one `ino` names: a name flipped since)."""
        try:
            t = fut.result()
        except cfi.CfiError as e:
            self.skipped[path] = str(e).removeprefix(f"{candidate}: ")
            return None
        except Exception as e:  # the worker died or was stopped: no table, said why
            self.skipped[path] = f"not compiled ({type(e).__name__})"
            return None
        if t.file != (0, 0) and ino != (0, 0) and t.file != ino:
            self.skipped[path] = "the file changed while its table was compiled"
            return None
        if t.has_frame_pointers:
            return None  # the frame-pointer walk is right here
        if self.used + len(t.rows) > ROWS:
            self.skipped[path] = f"all {ROWS} unwind rows in use"
            return None
        table = _Table(self.used, len(t.rows))
        self._store_rows(table.row, t.rows)
        self.used += len(t.rows)
        self.loaded[path] = len(t.rows)
        return table

    def _store_rows(self, first: int, rows: list[cfi.Row]) -> None:
        tbl = self.bpf["unwind_rows"]
        keys = (tbl.Key * len(rows))()
        values = (tbl.Leaf * len(rows))()
        for i, r in enumerate(rows):
            keys[i] = first + i
            v = values[i]
            v.pc, v.cfa, v.kind, v.rbp = r.pack()
        tbl.items_update_batch(keys, values)

    def _store_proc(self, pid: int, entries: list[tuple[int, int, int, int, int]]) -> None:
        tbl = self.bpf["unwind_procs"]
        key = ctypes.c_uint(pid)
        if not entries:
            with contextlib.suppress(KeyError):
                del tbl[key]
            return
        leaf = tbl.Leaf()
        leaf.n = len(entries)
        leaf.lo = min(e[0] for e in entries)
        leaf.hi = max(e[1] for e in entries)
        for k, (start, end, bias, row, rows) in enumerate(entries):
            m = leaf.m[k]
            m.start, m.end, m.bias, m.row, m.rows = start, end, bias & (2**64 - 1), row, rows
        tbl[key] = leaf

    def forget(self, pid: int) -> None:
        """An exited process: its entry goes (its pid may be reused)."""
        self.seen.pop(pid, None)
        self.on_stacks.pop(pid, None)
        self.tabled.pop(pid, None)
        self.slotted.pop(pid, None)
        if self.procs.pop(pid, None):
            with contextlib.suppress(KeyError):
                del self.bpf["unwind_procs"][ctypes.c_uint(pid)]

    def close(self) -> None:
        self.compiler.close()

    def manifest(self) -> dict[str, Any]:
        return {
            "tables": [{"module": k, "rows": v} for k, v in sorted(self.loaded.items())],
            "skipped": [{"module": k, "reason": v} for k, v in sorted(
                {**{p: CROWDED for p, pids in self.crowded.items() if pids},
                 **self.skipped}.items())],
            "rows": self.used,
            "rows_max": ROWS,
            "walk": self.walk,
            "cache": str(self.compiler.cache_dir) if self.compiler.cache_dir else None,
        }
