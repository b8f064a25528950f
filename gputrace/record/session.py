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
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gputrace import identity, schema
from gputrace.record import decode, hooks, procfs
from gputrace.record import driver_version as driver
from gputrace.record.held_open import device_holders
from gputrace.record.incidents import IncidentSignal
from gputrace.trace.writer import TraceWriter

if TYPE_CHECKING:  # the layers import this module
    from gputrace.record.layer import Batch, Buffer

Observer = Callable[[str, pa.Table], None]
MERGED_KEYS = ("drops", "clock", "decode_errors")
"""Manifest keys whose dicts layers add to (other keys a fragment replaces)."""
_PAGE = os.sysconf("SC_PAGE_SIZE")
EARLY_MAX = 4096
"""Facts read ahead of the writer thread kept at most (see Session.watch_procs)."""


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
    uvm_inits, exited; writer-thread fields: procs, forks, alive_ns, writer
    appends; `early` is written by the poll thread and taken by the writer (locked)."""

    opts: Any  # recorder.Options
    prefix: str
    drv: driver.DriverInfo
    attach_plan: list[hooks.Hook]
    skipped_hooks: list[dict[str, str]]
    start_ns: int
    filtered: bool = False
    program: tuple[str, list[str]] = ("", [])  # the syscall layer's source and cflags
    api_extensions: list[Any] = field(default_factory=list)  # probes built into the API program
    api: Any = None  # the API layer's loaded program (api/libcuda.LibcudaProbes)
    probes: Any = None  # the syscall layer's loaded program (the CPU-fault hook is in it)
    targets: list[int] = field(default_factory=list)
    seeded: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    writer: TraceWriter | None = None
    child: subprocess.Popen[bytes] | None = None
    cmd_info: tuple[str | None, str | None, str | None] = (None, None, None)
    procs: dict[int, procfs.ProcInfo] = field(default_factory=dict)
    forks: dict[int, tuple[int, int]] = field(default_factory=dict)  # child -> (ts, ppid)
    # (pid, event ts) -> facts the poll thread read when that event arrived
    early: dict[tuple[int, int], procfs.ProcInfo] = field(default_factory=dict)
    alive_ns: int = 0  # latest event time the writer thread decoded: pids held then
    boot_offset_ns: int = field(default_factory=lambda: time.clock_gettime_ns(
        time.CLOCK_BOOTTIME) - time.clock_gettime_ns(time.CLOCK_MONOTONIC))  # fmt: skip
    _proc_cursor: int = 0  # chunks of the raw proc_events watch_procs has read
    exited: set[int] = field(default_factory=set)  # exits since the last housekeeping
    gone: dict[int, int] = field(default_factory=dict)  # pid -> exit ts of its last row
    tracked: set[int] = field(default_factory=set)  # pids whose CPU faults the tools stream has
    uvm_inits: list[tuple[int, int]] = field(default_factory=list)  # (pid, fd) to attach
    names: dict[int, str] = field(default_factory=dict)  # comm of tracked pids after exit
    cpu_faults_replaced: int = 0  # tracepoint CPU faults dropped for tracked pids
    decode_errors: dict[str, int] = field(default_factory=dict)
    observers: list[Observer] = field(default_factory=list)
    observer_errors: int = 0
    # "no memory" failures in the rows appended: the RM sampler (and any other part)
    # subscribes to act at once
    incidents: IncidentSignal = field(default_factory=IncidentSignal)
    rows: dict[str, int] = field(default_factory=dict)
    backlog_bytes: int = 0  # raw bytes handed to the writer thread and not yet taken
    spill_bytes: int = 32 << 20  # past this backlog, ioctl events are written raw
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _procs_pending: list[dict[str, Any]] = field(default_factory=list)  # rows on disk
    # where containers' and pods' names are read (record --kube-root; "/" on a host)
    node: identity.NodeNames = field(default_factory=identity.NodeNames)
    cgroup_root: Path = procfs.CGROUP2

    def __post_init__(self) -> None:
        root = Path(getattr(self.opts, "kube_root", "/"))
        self.node = identity.NodeNames(root)
        # the host's cgroup tree: in a pod, the host's /sys/fs/cgroup mounted under
        # --kube-root (the pod's own /sys/fs/cgroup shows its cgroup namespace only)
        self.cgroup_root = root / procfs.CGROUP2.relative_to("/")

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
            if "ts_ns" in batch.schema.names and batch.num_rows:
                top = pc.max(batch.column("ts_ns")).as_py()
                self.alive_ns = max(self.alive_ns, int(top or 0))
            if "pid" in batch.schema.names:
                pids = batch.column("pid")
                ts = batch.column("ts_ns") if "ts_ns" in batch.schema.names else None
                ok = pc.is_valid(pids)
                self.note_pids(pids.filter(ok).to_numpy(zero_copy_only=False),
                               None if ts is None else ts.filter(ok).to_numpy(
                                   zero_copy_only=False))  # fmt: skip
            self.append(buf.table, batch)

    def append(self, table: str, batch: Batch) -> None:
        """Hand rows to the incident signal (first: an incident's RM sample must not
        wait for the write), append them to the trace, then hand them to the observers."""
        self.incidents.observe(table, batch)
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

    def backlog(self, n: int) -> None:
        """Raw bytes queued for (n > 0) or taken by (n < 0) the writer thread."""
        if n:
            with self._lock:
                self.backlog_bytes += n

    def behind(self) -> bool:
        """Is the writer thread so far behind that ioctl events should be written raw
        (`record --raw`: always; `spill_bytes` 0: always)? Then the recorder's CPU goes
        to the ring buffers rather than to decoding, and nothing is dropped for want
        of it; the recorder decodes those parts when the recording ends."""
        if self.opts.raw:
            return True
        # live observers must see every row as it is recorded: they never spill
        return not self.observers and self.backlog_bytes >= self.spill_bytes

    def append_raw(self, record: str, data: bytes) -> None:
        """Append whole `record` structs undecoded (`record --raw`): only what the
        recording itself needs is read of them (the latest time, the processes
        seen), with numpy over their fields; `gputrace convert` decodes the rest."""
        spec = decode.RAW_RECORDS[record]
        table, dtype = spec.table, spec.dtype
        n, rest = divmod(len(data), dtype.itemsize)
        self.skip(spec.buffer, int(rest > 0), "cut short")
        if not n:
            return
        ev = np.frombuffer(data, dtype, n)
        self.alive_ns = max(self.alive_ns, int(ev["ts_ns"].max()))
        pids = ev["pid"]
        # events come in per-CPU batches, time-ordered runs of one pid: the runs'
        # starts hold every pid, and its first event
        starts = np.r_[True, pids[1:] != pids[:-1]]
        self.note_pids(pids[starts], ev["ts_ns"][starts])
        self.w.append_raw(table, record, dtype, memoryview(data)[: n * dtype.itemsize])
        with self._lock:
            self.rows[table] = self.rows.get(table, 0) + n

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
    # A processes row is one process instance. Its facts come from what the
    # probes kept of its fork and exec (`proc_starts`: ppid, start time, cgroup
    # id) and from /proc, read only while /proc/PID is still that process
    # (procfs.read_checked). The poll thread reads them as soon as a process's
    # first event is consumed (`watch_procs`, every POLL_S), so that a short-lived
    # process is read before it exits; the writer thread, which decodes up to a
    # rotation later, takes those facts (`early`) or, failing them, reads now.
    def comm(self, pid: int) -> str | None:
        """The process name the recorder knows for `pid` (alive or exited)."""
        info = self.procs.get(pid)
        return (info.comm if info is not None else None) or self.names.get(pid)

    def note_pids(self, pids: np.ndarray[Any, Any], ts: np.ndarray[Any, Any] | None = None) -> None:
        """Make the processes of these events known. An event of a pid whose process
        exited, no later than that exit, is a late event of that process (events
        reach the recorder through several rings and per-CPU batches, so an exit can
        be read before its process's last events): it starts no new row."""
        if ts is None:
            for pid in np.unique(pids).tolist():
                if pid not in self.procs:
                    self.new_proc(int(pid))
            return
        order = np.argsort(ts, kind="stable")
        uniq, first = np.unique(pids[order], return_index=True)
        for pid, t in zip(uniq.tolist(), ts[order][first].tolist(), strict=True):
            if pid in self.procs:
                continue
            gone = self.gone.get(pid)
            if gone is not None and t <= gone:
                continue
            self.gone.pop(pid, None)
            self.new_proc(int(pid))

    def new_proc(self, pid: int, ts_ns: int | None = None,
                 exact: bool = False) -> procfs.ProcInfo:  # fmt: skip
        """The row of a process first seen in an event at `ts_ns` (None: in rows
        decoded up to `alive_ns`); `exact`: only facts read for that very event (an
        exec: earlier ones describe the old image)."""
        at = ts_ns if ts_ns is not None else self.alive_ns
        info = self._take_early(pid, at, exact) or self.facts(pid, at)
        fork = self.forks.pop(pid, None)
        if fork is not None and info.start_ts_ns is None:
            info.start_ts_ns, info.ppid = fork
        self.procs[pid] = info
        return info

    def facts(self, pid: int, alive_ns: int) -> procfs.ProcInfo:
        """What is known of the process that held `pid` at `alive_ns` (CLOCK_MONOTONIC):
        its fork and exec as the probes kept them, and /proc if it is still that
        process. Fields nothing vouches for stay None."""
        info = procfs.ProcInfo(pid)
        st = self.start_entry(pid)
        fork_boot: int | None = None
        cgroup_id = 0
        if st is not None:
            fork_ns, exec_ns = int(st["fork_ns"]), int(st["exec_ns"])
            if 0 < fork_ns <= alive_ns:  # a later fork is a later process with this pid
                info.start_ts_ns, info.ppid = fork_ns, int(st["ppid"])
                fork_boot = int(st["fork_boot_ns"])
            if fork_ns <= alive_ns and 0 < exec_ns <= alive_ns and exec_ns >= fork_ns:
                cgroup_id = int(st["cgroup_id"])
        ok = procfs.read_checked(pid, info, fork_boot_ns=fork_boot,
                                 alive_boot_ns=alive_ns + self.boot_offset_ns,
                                 node=self.node)  # fmt: skip
        if not ok and cgroup_id:  # gone: its cgroup, if that still exists, says who it was
            info.cgroup = procfs.cgroup_by_id(cgroup_id, self.cgroup_root)
            info.identity = self.node.named(identity.from_cgroup(info.cgroup))
        return info

    def start_entry(self, pid: int) -> np.void | None:
        """The probes' `proc_starts` entry of `pid` (decode.PROC_START_DTYPE), if any."""
        bpf = getattr(self.probes, "bpf", None)
        if bpf is None:
            return None
        try:
            tbl = bpf["proc_starts"]
            leaf = tbl[tbl.Key(pid)]
        except (KeyError, IndexError):
            return None
        raw = bytes(leaf)
        if len(raw) != decode.PROC_START_DTYPE.itemsize:
            return None
        out: np.void = np.frombuffer(raw, dtype=decode.PROC_START_DTYPE)[0]
        return out

    def watch_procs(self) -> None:
        """Poll thread, right after the ring buffers were consumed: read the facts of
        each process whose fork, exec, first device open or UVM init just arrived,
        while it is most likely still alive (its exit alone needs nothing)."""
        raw = getattr(self.probes, "raw", {}).get("proc_events")
        if raw is None:
            return
        chunks, self._proc_cursor = raw[self._proc_cursor :], len(raw)
        if not chunks:
            return
        ev, _bad = decode.records(b"".join(chunks), decode.PROC_DTYPE)
        for e in ev[np.argsort(ev["ts_ns"], kind="stable")]:
            kind, pid, ts = int(e["kind"]), int(e["pid"]), int(e["ts_ns"])
            if kind in (decode.PROC_FORK, decode.PROC_EXEC, decode.PROC_SEEN,
                        decode.PROC_UVM_INIT) and pid > 0:  # fmt: skip
                if kind == decode.PROC_FORK and procfs.tgid(pid) != pid:
                    continue  # a thread (pthread_create is a fork to the probe), or gone
                info = self.facts(pid, ts)
                with self._lock:
                    self.early[(pid, ts)] = info
                    # facts no later event takes (a child gone unseen): keep EARLY_MAX
                    if len(self.early) > EARLY_MAX:
                        del self.early[min(self.early, key=lambda k: k[1])]

    def procs_taken(self) -> None:
        """Poll thread, after the layers handed their data on: `watch_procs` starts
        again at the first chunk not yet watched."""
        raw = getattr(self.probes, "raw", {}).get("proc_events")
        self._proc_cursor = len(raw) if raw is not None else 0

    def _take_early(self, pid: int, ts_ns: int, exact: bool = False) -> procfs.ProcInfo | None:
        """The latest facts `watch_procs` read for an event of `pid` at or before
        `ts_ns` (with `exact`, at it); those and older ones of the pid are dropped
        (earlier events of this instance, or of an instance already written)."""
        with self._lock:
            keys = sorted(k for k in self.early if k[0] == pid and k[1] <= ts_ns)
            latest = self.early[keys[-1]] if keys else None
            hit = self.early.get((pid, ts_ns)) if exact else latest
            for k in keys:
                del self.early[k]
        return hit

    def proc_events(self, ev: np.ndarray[Any, Any]) -> None:
        """Fork, exec, exit (and UVM_INIT, seen) events in time order: the
        processes table gets a row at each exit and at the end."""
        for e in ev[np.argsort(ev["ts_ns"], kind="stable")]:
            kind, pid, ts = int(e["kind"]), int(e["pid"]), int(e["ts_ns"])
            comm = bytes(e["comm"]).decode("utf-8", "replace")
            self.alive_ns = max(self.alive_ns, ts)
            if kind == decode.PROC_FORK:  # the child's row starts at its first event
                self.forks[pid] = (ts, int(e["ppid"]))
                continue
            if kind not in (decode.PROC_EXEC, decode.PROC_EXIT, decode.PROC_SEEN,
                            decode.PROC_UVM_INIT):  # fmt: skip
                self.skip("proc_events", 1, f"unknown kind {kind}")
                continue
            # UVM_INIT: the poll thread attached its tracker already; here it only
            # makes the process known, as its ioctl rows would
            fresh = pid not in self.procs
            info = self.procs.get(pid) or self.new_proc(pid, ts, exact=kind == decode.PROC_EXEC)
            if kind == decode.PROC_EXEC:
                if not fresh:  # a new image: what was read of the old one no longer holds
                    now = self._take_early(pid, ts, exact=True) or self.facts(pid, ts)
                    procfs.copy_facts(info, now)
                    if info.ppid is None:
                        info.ppid = now.ppid
                info.comm = comm
                if self.child is not None and pid == self.child.pid:
                    info.comm, info.exe, info.cmdline = self.cmd_info
                if pid in self.names and info.comm:
                    self.names[pid] = info.comm
            elif kind == decode.PROC_EXIT:
                info.exit_ts_ns = ts
                code = int(e["exit_code"])
                info.exit_code = code if code >= 0 else None
                info.comm = comm if info.comm is None else info.comm
                # the main thread's exit: threads still running make it a zombie that
                # keeps its files (and a zombie CMD cannot be waited for yet)
                info.zombie_threads = procfs.zombie_threads_of(pid)
                if self.child and pid == self.child.pid and not info.zombie_threads:
                    rc = self.child.wait()
                    info.exit_code = rc << 8 if rc >= 0 else -rc
                self.write_procs([info])
                del self.procs[pid]
                self.gone[pid] = ts
                if len(self.gone) > EARLY_MAX:  # the oldest exits: their late events are long in
                    del self.gone[min(self.gone, key=self.gone.__getitem__)]
                self._take_early(pid, ts)  # facts of this instance never used
                self.exited.add(pid)
            else:
                self._take_early(pid, ts)

    def finish_processes(self) -> None:
        for pid in device_holders(sorted(self.forks), self.prefix + "nvidia"):
            self.new_proc(pid)  # a child that only inherited device files: no event yet
        self.write_procs(list(self.procs.values()))
        self.procs.clear()

    def write_procs(self, infos: list[procfs.ProcInfo]) -> None:
        if not infos:
            return
        self.append("processes", _proc_table(_proc_rows(infos)))

    def checkpoint_procs(self) -> None:
        """Writer thread, at each rotation: the rows of the processes still running
        go to disk now (the processes table's PENDING rows), so a recorder killed
        later loses none of their facts; rewritten only when they changed."""
        rows = _proc_rows(list(self.procs.values()))
        if rows == self._procs_pending:
            return
        self.w.set_pending("processes", _proc_table(rows) if rows else None)
        self._procs_pending = rows

    def mono_ns(self) -> int:
        return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def _proc_rows(infos: list[procfs.ProcInfo]) -> list[dict[str, Any]]:
    who = {c.name for c in schema.IDENTITY_COLUMNS}  # in ProcInfo.identity
    names = [c.name for c in schema.PROCESSES.columns]
    return [{n: getattr(i.identity if n in who else i, n) for n in names} for i in infos]


def _proc_table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=schema.PROCESSES.arrow_schema)
