"""The recording session: load probes, start or attach to targets, poll ring
buffers, decode in bulk, rotate parts, and finish the trace on exit or signal."""

from __future__ import annotations

import os
import platform
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import pyarrow as pa

from gputrace import schema
from gputrace.errors import GputraceError, UsageError
from gputrace.record import cpufaults, cuda, decode, driver, hooks, loader, procfs
from gputrace.tracedir import STATUS_COMPLETE, TraceWriter

POLL_S = 0.05
ROTATE_S = 1.0
ROTATE_ROWS = 1_000_000
DECODE_BYTES = 8 << 20  # hand ioctl events to the writer thread every ~50k


def mono_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


@dataclass
class Options:
    output: str
    pids: list[int] = field(default_factory=list)
    duration_s: float | None = None
    device_dir: str = "/dev"
    driver_version: str | None = None
    force: bool = False
    command: list[str] = field(default_factory=list)
    libcuda: str | None = None  # --libcuda PATH (API layer)


def device_prefix(device_dir: str) -> str:
    p = os.path.abspath(device_dir)
    if not os.path.isdir(p):
        raise UsageError(f"--device-dir {device_dir}: no such directory")
    prefix = p.rstrip("/") + "/"
    if len(prefix.encode()) > 200:
        raise UsageError(f"--device-dir {device_dir}: path longer than 200 bytes")
    return prefix


def build_program(opts: Options) -> tuple[str, list[str], driver.DriverInfo, Any]:
    drv = driver.resolve(opts.driver_version)
    tracefs = hooks.ensure_tracefs() if os.geteuid() == 0 else hooks.TRACEFS
    plan = hooks.plan(tracefs)
    return loader.probe_source(), loader.cflags(drv, plan[2]), drv, plan


def check_privileges() -> None:
    if os.geteuid() == 0:
        return
    try:
        status = Path("/proc/self/status").read_text()
        cap = int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("CapEff")), 16)
    except (OSError, StopIteration, ValueError):
        cap = 0
    if cap & (1 << 39) and cap & (1 << 38):  # CAP_BPF and CAP_PERFMON
        return
    raise GputraceError("record needs root (or CAP_BPF and CAP_PERFMON): run it with sudo")


class Recorder:
    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.stop_reason: str | None = None
        self.procs: dict[int, procfs.ProcInfo] = {}
        self.forks: dict[int, tuple[int, int]] = {}  # child -> (ts, ppid)
        self.exited: set[int] = set()
        self.child: subprocess.Popen[bytes] | None = None
        self.error: BaseException | None = None

    # ------------------------------------------------------------ setup
    def _validate(self) -> str:
        check_privileges()
        out = Path(self.opts.output)
        if out.exists() and not self.opts.force:
            raise GputraceError(f"{out} already exists (use --force to overwrite)")
        for pid in self.opts.pids:
            if pid <= 0 or not procfs.is_alive(pid):
                raise UsageError(f"-p {pid}: no such process")
        if self.opts.pids and self.opts.command:
            raise UsageError("give either -p PID or -- CMD, not both")
        if self.opts.duration_s is not None and self.opts.duration_s <= 0:
            raise UsageError("-d must be a positive number of seconds")
        if self.opts.libcuda is not None:
            self.opts.libcuda = cuda.check_libcuda(self.opts.libcuda)
        return device_prefix(self.opts.device_dir)

    def run(self) -> int:
        prefix = self._validate()
        source, flags, drv, (attach, skipped, _defs) = build_program(self.opts)
        loader.check_headers()
        probes = loader.Probes(source, flags)
        try:
            self.api = cuda.ApiLayer(self.opts.libcuda)  # API layer: its own BPF object
            try:
                return self._record(probes, prefix, drv, attach, skipped)
            finally:
                self.api.close()
        finally:
            probes.close()

    def _record(
        self,
        probes: loader.Probes,
        prefix: str,
        drv: driver.DriverInfo,
        attach: list[hooks.Hook],
        skipped: list[dict[str, str]],
    ) -> int:
        opts = self.opts
        filtered = bool(opts.pids or opts.command)
        probes.configure(self_tgid=os.getpid(), filter_targets=filtered, prefix=prefix)
        probes.set_uvm_layouts(drv)
        release_fd = -1
        if opts.command:
            release_fd = self._spawn(opts.command)
            assert self.child is not None
            targets = [self.child.pid]
        elif opts.pids:
            targets = sorted({p for pid in opts.pids for p in [pid, *procfs.children(pid)]})
        else:
            targets = []
        probes.add_targets(targets)
        self.api.configure(self_tgid=os.getpid(), filter_targets=filtered, pause=filtered)
        self.api.add_targets(targets)
        self.api.start(targets, filtered)
        seeded = procfs.seed(targets if filtered else procfs.all_pids(), prefix)
        probes.seed_fds(seeded)
        probes.seed_managed(cpufaults.seed(sorted({*targets, *(p for p, _ in seeded)}), prefix))
        for pid in targets if filtered else sorted({p for p, _ in seeded}):
            if self.child is None or pid != self.child.pid:
                self.procs[pid] = procfs.read_info(pid)
        start = mono_ns()
        writer = TraceWriter(
            opts.output, force=opts.force, rotate_rows=ROTATE_ROWS,
            manifest=self._manifest(prefix, drv, attach, skipped, targets, start),
        )  # fmt: skip
        self.writer = writer
        if seeded:  # fds open before recording: "seen" rows at the start time
            comms = {p: i.comm for p, i in self.procs.items()}
            writer.append("files", decode.files_batch(decode.seen_events(seeded, start, comms)))
        self._install_signals()
        print(
            f"gputrace: recording ({probes.attached + self.api.count} hooks attached); "
            "Ctrl-C to stop",
            file=sys.stderr,
            flush=True,
        )
        if release_fd >= 0:
            os.write(release_fd, b"go\n")
            os.close(release_fd)
        deadline = None if opts.duration_s is None else time.monotonic() + opts.duration_s
        next_rotate = time.monotonic() + ROTATE_S
        work: queue.Queue[tuple[str, Any] | None] = queue.Queue()
        worker = threading.Thread(target=self._worker, args=(work, writer), daemon=True)
        worker.start()
        status = STATUS_COMPLETE
        try:
            while self.stop_reason is None and self.error is None:
                time.sleep(POLL_S)
                probes.consume()
                for item in self.api.drain():
                    work.put(item)
                now = time.monotonic()
                if self.child is not None and self.child.poll() is not None:
                    self.stop_reason = "command exited"
                elif opts.pids and not any(procfs.is_alive(p) for p in targets):
                    self.stop_reason = "targets exited"
                elif deadline is not None and now >= deadline:
                    self.stop_reason = "duration"
                if now >= next_rotate:
                    next_rotate = now + ROTATE_S
                    self._hand_over(probes, work, flush=True)
                    work.put(("rotate", {**probes.drops(), **self.api.drops()}))
                    gone, self.exited = self.exited, set()
                    probes.forget_tgids(gone)
                    if gone:
                        probes.forget_managed()
                elif (probes.pending_bytes("ioctl_events")
                      + probes.pending_bytes("fault_events")) >= DECODE_BYTES:
                    self._hand_over(probes, work, flush=False)
            self._hand_over(probes, work, flush=True)
            work.put(("leftover", probes.leftover_staging()))
            work.put(("fault_leftover", probes.leftover_fault_staging()))
            work.put(("fault_stats", probes.fault_stats()))
            for item in self.api.drain():
                work.put(item)
            work.put(("drops", {**probes.drops(), **self.api.drops()}))
        finally:
            work.put(None)
            worker.join()
            self._finish_processes(writer)
            writer.update_manifest(end_ts_ns=mono_ns())
            writer.close(status)
        if self.error is not None:
            raise self.error
        return 0

    def _spawn(self, cmd: list[str]) -> int:
        """Start CMD blocked on a pipe until the probes are attached; return the pipe."""
        if shutil.which(cmd[0]) is None:
            raise UsageError(f"{cmd[0]}: command not found")
        r, w = os.pipe()
        shim = (
            "import os, sys; fd = int(sys.argv[1]); os.read(fd, 1); os.close(fd); "
            "os.execvp(sys.argv[2], sys.argv[2:])"
        )
        self.child = subprocess.Popen([sys.executable, "-c", shim, str(r), *cmd], pass_fds=[r])
        os.close(r)
        info = procfs.read_info(self.child.pid)
        info.ppid, info.start_ts_ns = os.getpid(), mono_ns()
        info.comm = os.path.basename(cmd[0])[:15]
        info.exe = shutil.which(cmd[0])
        info.cmdline = " ".join(cmd)
        self.procs[self.child.pid] = info
        self.cmd_info = (info.comm, info.exe, info.cmdline)
        return w

    def _install_signals(self) -> None:
        def handler(signum: int, _frame: FrameType | None) -> None:
            self.stop_reason = signal.Signals(signum).name

        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)

    def _manifest(
        self,
        prefix: str,
        drv: driver.DriverInfo,
        attach: list[hooks.Hook],
        skipped: list[dict[str, str]],
        targets: list[int],
        start: int,
    ) -> dict[str, Any]:
        uname = platform.uname()
        gpus = sorted(
            (k[1], str(Path(prefix) / name))
            for name in os.listdir(prefix)
            if (k := procfs.device_kind(name)) is not None and k[0] == procfs.DEV_GPU
        )
        if self.opts.command:
            target: dict[str, Any] = {"mode": "command", "command": self.opts.command,
                                      "pids": targets}  # fmt: skip
        elif self.opts.pids:
            target = {"mode": "pids", "pids": targets}
        else:
            target = {"mode": "host"}
        return {
            "host": {"hostname": socket.gethostname(), "kernel": uname.release,
                     "machine": uname.machine},
            "driver_version": drv.version,
            "driver": {"version": drv.version, "source": drv.source,
                       "layouts_of": drv.layout_version},
            "gpus": [{"index": i, "path": p} for i, p in gpus],
            "device_dir": prefix,
            "clock": {"source": "CLOCK_MONOTONIC",
                      "realtime_offset_ns": time.time_ns() - mono_ns()},
            "target": target,
            "layers": ["syscall", *cpufaults.layers(attach)],
            "hooks": {"attached": [h.name for h in attach], "skipped": skipped,
                      "notes": hooks.notes()},
            "drops": dict.fromkeys(loader.BUFFERS, 0),
            "start_ts_ns": start,
            "recorder": {"pid": os.getpid(), "argv": sys.argv},
        }

    # ------------------------------------------------------------ data
    def _hand_over(self, probes: loader.Probes, work: queue.Queue[Any], flush: bool) -> None:
        """Poll-thread side: pass raw bytes to the writer thread (no decoding here)."""
        if flush:
            probes.flush_staging()
        probes.consume()
        # process exits last: rows of a process drained with its exit still find it
        for name in sorted(loader.BUFFERS, key=lambda n: n == "proc_events"):
            raw = probes.take(name)
            if raw:
                work.put((name, raw))

    def _worker(self, work: queue.Queue[tuple[str, Any] | None], writer: TraceWriter) -> None:
        """Writer thread: decode in bulk, append, rotate (Arrow and zstd release the GIL)."""
        while (item := work.get()) is not None:
            if self.error is not None:
                continue
            kind, data = item
            try:
                self._handle(kind, data, writer)
            except BaseException as e:
                self.error = e

    def _handle(self, kind: str, data: Any, writer: TraceWriter) -> None:
        if kind in ("ioctl_events", "leftover"):
            ev = (decode.ioctl_events(data) if kind == "ioctl_events"
                  else decode.ioctl_events_from_batches(data))  # fmt: skip
            if len(ev):
                self._note_pids(ev["pid"])
                writer.append("ioctls", decode.ioctls_batch(ev))
        elif kind in ("fault_events", "fault_leftover"):
            cpufaults.write(kind, data, writer)
        elif kind == "fault_stats":
            writer.update_manifest(cpu_faults=data)
        elif kind == "mapping_events":
            mev = np.frombuffer(data, decode.MAPPING_DTYPE)
            self._note_pids(mev["pid"])
            writer.append("mappings", decode.mappings_batch(mev))
        elif kind == "fd_events":
            fev = np.frombuffer(data, decode.FD_DTYPE)
            self._note_pids(fev["pid"])
            writer.append("files", decode.files_batch(fev))
        elif kind == "proc_events":
            self._proc_events(np.frombuffer(data, decode.PROC_DTYPE), writer)
        elif kind.startswith("api:"):
            self.api.write(kind, data, writer)
        elif kind == "rotate":
            writer.update_manifest(drops=data)
            writer.rotate()
        elif kind == "drops":
            writer.update_manifest(drops=data)

    def _note_pids(self, pids: np.ndarray[Any, Any]) -> None:
        for pid in np.unique(pids).tolist():
            if pid not in self.procs:
                self._new_proc(int(pid))

    def _new_proc(self, pid: int) -> procfs.ProcInfo:
        info = procfs.ProcInfo(pid)
        fork = self.forks.pop(pid, None)
        if fork is not None:
            info.start_ts_ns, info.ppid = fork
        self.procs[pid] = procfs.read_info(pid, info)
        return self.procs[pid]

    def _proc_events(self, ev: np.ndarray[Any, Any], writer: TraceWriter) -> None:
        for e in ev[np.argsort(ev["ts_ns"], kind="stable")]:
            kind, pid = int(e["kind"]), int(e["pid"])
            comm = bytes(e["comm"]).decode("utf-8", "replace")
            if kind == decode.PROC_FORK:
                self.forks[pid] = (int(e["ts_ns"]), int(e["ppid"]))
                continue
            info = self.procs.get(pid) or self._new_proc(pid)
            if kind == decode.PROC_EXEC:
                procfs.read_info(pid, info)
                info.comm = comm
                if self.child is not None and pid == self.child.pid:
                    info.comm, info.exe, info.cmdline = self.cmd_info
            elif kind == decode.PROC_EXIT:
                info.exit_ts_ns = int(e["ts_ns"])
                code = int(e["exit_code"])
                info.exit_code = code if code >= 0 else None
                if info.comm is None:
                    info.comm = comm
                if self.child is not None and pid == self.child.pid:
                    rc = self.child.wait()
                    info.exit_code = rc << 8 if rc >= 0 else -rc
                self._write_procs(writer, [info])
                del self.procs[pid]
                self.exited.add(pid)

    def _finish_processes(self, writer: TraceWriter) -> None:
        self._write_procs(writer, list(self.procs.values()))
        self.procs.clear()

    def _write_procs(self, writer: TraceWriter, infos: list[procfs.ProcInfo]) -> None:
        if not infos:
            return
        names = [c.name for c in schema.PROCESSES.columns]
        rows = [{n: getattr(i, n) for n in names} for i in infos]
        writer.append("processes", pa.Table.from_pylist(rows, schema=schema.PROCESSES.arrow_schema))
