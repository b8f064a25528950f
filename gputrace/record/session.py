"""What the layers of one recording share: options, targets, the trace writer,
the processes seen so far, decode error counts, live observers and statistics."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from gputrace import schema
from gputrace.record import decode, driver, hooks, procfs
from gputrace.tracewriter import TraceWriter

if TYPE_CHECKING:  # the layers import this module
    from gputrace.record.layers.base import Batch, Buffer

Observer = Callable[[str, pa.Table], None]
MERGED_KEYS = ("drops", "clock", "decode_errors")
"""Manifest keys whose dicts layers add to (other keys a fragment replaces)."""
_PAGE = os.sysconf("SC_PAGE_SIZE")


def merged(m: dict[str, Any], frag: dict[str, Any]) -> dict[str, Any]:
    """The manifest keys a layer's fragment changes: `layers` joined in order, the
    MERGED_KEYS dicts added to, other keys replaced."""
    out: dict[str, Any] = {}
    for k, v in frag.items():
        if k == "layers":
            have = list(m.get("layers", []))
            out[k] = have + [x for x in v if x not in have]
        elif k in MERGED_KEYS:
            out[k] = {**m.get(k, {}), **v}
        else:
            out[k] = v
    return out


@dataclass(frozen=True)
class Stats:
    """A snapshot of a recording in progress (`Recorder.stats()`)."""

    rows: dict[str, int]  # rows appended per table so far
    drops: dict[str, int]  # events lost by full buffers, as of the last rotation
    decode_errors: dict[str, int]  # records skipped as unreadable
    observer_errors: int  # exceptions raised by observers (each call is isolated)
    cpu_s: float  # CPU time of the recorder process (all threads, user + system)
    rss_bytes: int  # the recorder's resident memory now


@dataclass
class Session:
    """One recording's shared state. Poll-thread fields: targets, seeded, tracked,
    uvm_inits, exited; writer-thread fields: procs, forks, writer appends."""

    opts: Any  # recorder.Options
    prefix: str
    drv: driver.DriverInfo
    attach_plan: list[hooks.Hook]
    skipped_hooks: list[dict[str, str]]
    start_ns: int
    filtered: bool = False
    program: tuple[str, list[str]] = ("", [])  # the syscall layer's source and cflags
    probes: Any = None  # the syscall layer's loaded program (the CPU-fault hook is in it)
    targets: list[int] = field(default_factory=list)
    seeded: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    writer: TraceWriter | None = None
    child: subprocess.Popen[bytes] | None = None
    cmd_info: tuple[str | None, str | None, str | None] = (None, None, None)
    procs: dict[int, procfs.ProcInfo] = field(default_factory=dict)
    forks: dict[int, tuple[int, int]] = field(default_factory=dict)  # child -> (ts, ppid)
    exited: set[int] = field(default_factory=set)  # exits since the last housekeeping
    tracked: set[int] = field(default_factory=set)  # pids whose CPU faults the tools stream has
    uvm_inits: list[tuple[int, int]] = field(default_factory=list)  # (pid, fd) to attach
    names: dict[int, str] = field(default_factory=dict)  # comm of tracked pids after exit
    cpu_faults_replaced: int = 0  # tracepoint CPU faults dropped for tracked pids
    decode_errors: dict[str, int] = field(default_factory=dict)
    observers: list[Observer] = field(default_factory=list)
    observer_errors: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def w(self) -> TraceWriter:
        assert self.writer is not None
        return self.writer

    # ------------------------------------------------------------ rows
    def decode(self, layer: Any, buf: Buffer, kind: str, data: Any) -> None:
        """Decode one work item and append its rows. A decoder that raises loses
        that item (counted in `decode_errors`), never the recording; the append
        itself (disk full, ...) is not guarded."""
        try:
            batch, bad = buf.decoder(layer, self, kind, data)
        except Exception as e:
            first = str(e).splitlines()[0] if str(e) else ""
            size = len(data) if isinstance(data, bytes | bytearray | memoryview) else 0
            self.skip(buf.counted_as, max(1, size // buf.dtype.itemsize),
                      f"{type(e).__name__}: {first}")  # fmt: skip
            return
        self.skip(buf.counted_as, bad, "cut short or unknown codes")
        if batch is not None and batch.num_rows:
            if "pid" in batch.schema.names:
                self.note_pids(batch.column("pid").drop_null().to_numpy(zero_copy_only=False))
            self.append(buf.table, batch)

    def append(self, table: str, batch: Batch) -> None:
        """Append rows to the trace, then hand them to the observers."""
        self.w.append(table, batch)
        with self._lock:
            self.rows[table] = self.rows.get(table, 0) + batch.num_rows
        if self.observers:
            t = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
            for fn in list(self.observers):
                try:
                    fn(table, t)
                except Exception as e:  # an observer never ends the recording
                    self.observer_errors += 1
                    if self.observer_errors == 1:
                        print(f"gputrace: warning: a live observer raised "
                              f"{type(e).__name__}: {e}; counted, recording goes on",
                              file=sys.stderr, flush=True)  # fmt: skip

    def skip(self, buffer: str, n: int, why: str) -> None:
        if n <= 0:
            return
        if not self.decode_errors.get(buffer):
            print(f"gputrace: warning: skipped {n} {buffer} records the decoder could not "
                  f"read ({why}); counted in the manifest's decode_errors",
                  file=sys.stderr, flush=True)  # fmt: skip
        with self._lock:
            self.decode_errors[buffer] = self.decode_errors.get(buffer, 0) + n

    def merge_manifest(self, frag: dict[str, Any]) -> None:
        """Merge a layer's manifest fragment into the trace's (see `merged`)."""
        self.w.update_manifest(**merged(self.w.manifest, frag))

    def stats(self) -> Stats:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        try:
            with open("/proc/self/statm") as f:
                rss = int(f.read().split()[1]) * _PAGE
        except (OSError, ValueError, IndexError):
            rss = ru.ru_maxrss * 1024
        m = self.writer.manifest if self.writer is not None else {}
        with self._lock:
            rows, errors = dict(self.rows), dict(self.decode_errors)
        return Stats(rows=rows, drops=dict(m.get("drops", {})), decode_errors=errors,
                     observer_errors=self.observer_errors, cpu_s=ru.ru_utime + ru.ru_stime,
                     rss_bytes=rss)  # fmt: skip

    # ------------------------------------------------------------ processes
    def comm(self, pid: int) -> str | None:
        """The process name the recorder knows for `pid` (alive or exited)."""
        info = self.procs.get(pid)
        return (info.comm if info is not None else None) or self.names.get(pid)

    def note_pids(self, pids: np.ndarray[Any, Any]) -> None:
        for pid in np.unique(pids).tolist():
            if pid not in self.procs:
                self.new_proc(int(pid))

    def new_proc(self, pid: int) -> procfs.ProcInfo:
        info = procfs.ProcInfo(pid)
        fork = self.forks.pop(pid, None)
        if fork is not None:
            info.start_ts_ns, info.ppid = fork
        self.procs[pid] = procfs.read_info(pid, info)
        return self.procs[pid]

    def proc_events(self, ev: np.ndarray[Any, Any]) -> None:
        """Fork, exec, exit (and UVM_INIT, seen) events in time order: the
        processes table gets a row at each exit and at the end."""
        for e in ev[np.argsort(ev["ts_ns"], kind="stable")]:
            kind, pid = int(e["kind"]), int(e["pid"])
            comm = bytes(e["comm"]).decode("utf-8", "replace")
            if kind == decode.PROC_FORK:
                self.forks[pid] = (int(e["ts_ns"]), int(e["ppid"]))
                continue
            if kind not in (decode.PROC_EXEC, decode.PROC_EXIT, decode.PROC_SEEN,
                            decode.PROC_UVM_INIT):  # fmt: skip
                self.skip("proc_events", 1, f"unknown kind {kind}")
                continue
            # UVM_INIT: the poll thread attached its tracker already; here it only
            # makes the process known, as its ioctl rows would
            info = self.procs.get(pid) or self.new_proc(pid)
            if kind == decode.PROC_EXEC:
                procfs.read_info(pid, info)
                info.comm = comm
                if self.child is not None and pid == self.child.pid:
                    info.comm, info.exe, info.cmdline = self.cmd_info
                if pid in self.names and info.comm:
                    self.names[pid] = info.comm
            elif kind == decode.PROC_EXIT:
                info.exit_ts_ns = int(e["ts_ns"])
                code = int(e["exit_code"])
                info.exit_code = code if code >= 0 else None
                if info.comm is None:
                    info.comm = comm
                if self.child is not None and pid == self.child.pid:
                    rc = self.child.wait()
                    info.exit_code = rc << 8 if rc >= 0 else -rc
                self.write_procs([info])
                del self.procs[pid]
                self.exited.add(pid)

    def finish_processes(self) -> None:
        self.write_procs(list(self.procs.values()))
        self.procs.clear()

    def write_procs(self, infos: list[procfs.ProcInfo]) -> None:
        if not infos:
            return
        names = [c.name for c in schema.PROCESSES.columns]
        rows = [{n: getattr(i, n) for n in names} for i in infos]
        self.append("processes",
                    pa.Table.from_pylist(rows, schema=schema.PROCESSES.arrow_schema))

    def mono_ns(self) -> int:
        return time.clock_gettime_ns(time.CLOCK_MONOTONIC)
