"""The recording session: load probes, start or attach to targets, poll ring
buffers, decode in bulk, rotate parts, and finish the trace on exit or signal."""

from __future__ import annotations

import contextlib
import math
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
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gputrace import schema
from gputrace.errors import GputraceError, UsageError
from gputrace.record import (
    cpufaults,
    cuda,
    decode,
    decode_cuda,
    decode_faults,
    driver,
    driver_layer,
    hooks,
    loader,
    procfs,
    rm_client,
    uvm_tools,
    watchdog,
)
from gputrace.tracedir import STATUS_COMPLETE, TraceWriter, check_output

POLL_S = 0.05
ROTATE_S = 1.0
ROTATE_ROWS = 1_000_000
DECODE_BYTES = 8 << 20  # hand ioctl events to the writer thread every ~50k
MAX_DURATION_S = 10 * 365 * 86400.0
"""-d at most ten years: past that a number is a typo, not a plan (and 1e300 s
would overflow the deadline arithmetic)."""
PID_MAX = 1 << 22  # PID_MAX_LIMIT: no kernel hands out larger pids
# code fields of each event struct and the names the decoders give them
IOCTL_CODES = {"device": schema.DEVICE_KINDS}
MAPPING_CODES = {"op": schema.MAPPING_OPS, "device": schema.DEVICE_KINDS}
FD_CODES = {"op": schema.FD_OPS, "device": schema.DEVICE_KINDS}
UVM_RECORD = np.dtype((np.void, 72))  # a V2 tools record: the unit of uvm_tools decode_errors
# CMD's first process: waits for the recorder's "g" (probes attached), then execs CMD.
# Anything else (the recorder died: EOF) ends it without running CMD.
SHIM = (
    "import os, sys\n"
    "fd = int(sys.argv[1])\n"
    "if os.read(fd, 1) != b'g':\n"
    "    os._exit(125)\n"
    "os.close(fd)\n"
    "try:\n"
    "    os.execvp(sys.argv[2], sys.argv[2:])\n"
    "except OSError as e:\n"
    "    sys.stderr.write(f'gputrace: error: cannot run {sys.argv[2]}: {e.strerror}\\n')\n"
    "    os._exit(126 if isinstance(e, PermissionError) else 127)\n"
)


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
    driver_layer: bool = True  # --no-driver-layer turns it off
    uvm_queue_entries: int = uvm_tools.DEFAULT_QUEUE_ENTRIES
    sample_ms: float = rm_client.DEFAULT_SAMPLE_MS  # --sample-interval
    uvm_queue_version: int | None = None  # --uvm-queue-version (tests)


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


def check_output_dir(output: str, force: bool) -> None:
    """Refuse an -o the trace writer would refuse, or whose parent cannot be made."""
    if not output:
        raise UsageError("-o needs a directory name")
    check_output(output, force=force)
    p = Path(os.path.abspath(output))
    if os.path.lexists(p):
        return
    ancestor = p.parent
    while not os.path.lexists(ancestor):
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise GputraceError(f"-o {output}: {ancestor} is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise GputraceError(f"-o {output}: cannot create a directory in {ancestor}")


def check_command(name: str) -> None:
    """CMD must be an executable the shim can exec."""
    if shutil.which(name) is None:
        raise UsageError(f"{name}: command not found")


def exit_status(ended: dict[str, Any] | None) -> int:
    """`record`'s exit status: CMD's own, or 128 + N when signal N ended it (as
    shells report it); 0 without a CMD or when CMD outlived the recording."""
    if ended is None or ended["status"] == "running":
        return 0
    if ended["status"] == "exited":
        return int(ended["code"])
    return 128 + int(ended["signal"])


def _ready(table: pa.Table) -> tuple[pa.Table, int]:
    """A table the driver layer already decoded, in the shape `Recorder._append` takes."""
    return table, 0


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
        self.released = False  # CMD was let go past its start gate
        self.error: BaseException | None = None
        # records skipped as unreadable, per ring buffer (manifest `decode_errors`)
        self.decode_errors: dict[str, int] = dict.fromkeys([*loader.BUFFERS, cuda.BUFFER], 0)
        self.driver: driver_layer.DriverLayer | None = None
        # pids with a UVM tools tracker: their CPU faults come from the tools stream only
        self.tracked: set[int] = set()
        self.cpu_faults_replaced = 0  # tracepoint CPU faults dropped for tracked pids
        self.no_tracker: set[int] = set()  # pids that initialized UVM but got no tracker
        self.names: dict[int, str] = {}  # pid -> comm of tracked processes (tools rows)
        self._driver_bad = 0  # the driver layer's decoder bad records, already counted
        self._driver_due = threading.Event()  # a driver poll is queued for the worker

    # ------------------------------------------------------------ setup
    def _validate(self) -> str:
        """Every check that can refuse the recording, before anything is started
        or written (CMD runs only once all of them passed); returns the device prefix."""
        opts = self.opts
        if opts.pids and opts.command:
            raise UsageError("give either -p PID or -- CMD, not both")
        d = opts.duration_s
        if d is not None and not (math.isfinite(d) and 0 < d <= MAX_DURATION_S):
            raise UsageError(f"-d must be a number of seconds above 0 and at most "
                             f"{MAX_DURATION_S:.0f}, not {d!r}")  # fmt: skip
        for pid in opts.pids:
            if not 0 < pid <= PID_MAX:
                raise UsageError(f"-p {pid}: not a process id (1 to {PID_MAX})")
        check_privileges()
        check_output_dir(opts.output, opts.force)
        for pid in opts.pids:
            if not procfs.is_alive(pid):
                raise UsageError(f"-p {pid}: no such process")
        if opts.command:
            check_command(opts.command[0])
        if opts.libcuda is not None:
            opts.libcuda = cuda.check_libcuda(opts.libcuda)
        prefix = device_prefix(opts.device_dir)
        self.driver = self._driver_layer(prefix)
        if self.driver is not None:
            self.decode_errors["uvm_tools"] = 0
        return prefix

    def _driver_layer(self, prefix: str) -> driver_layer.DriverLayer | None:
        """The driver layer, unless turned off or the device folder has neither
        nvidia-uvm-tools nor nvidiactl (nothing it could open). Built, not started."""
        opts = self.opts
        if not opts.driver_layer:
            return None
        try:  # built first: its options are refused even where it would not run
            layer = driver_layer.DriverLayer(
                prefix, opts.driver_version, queue_entries=opts.uvm_queue_entries,
                sample_ms=opts.sample_ms, rm=os.path.exists(prefix + "nvidiactl"),
                queue_version=opts.uvm_queue_version,
            )  # fmt: skip
        except uvm_tools.ToolsError as e:
            raise UsageError(str(e)) from None
        if not any(os.path.exists(prefix + n) for n in ("nvidia-uvm-tools", "nvidiactl")):
            return None
        return layer

    def run(self) -> int:
        """Record until CMD exits, the -p targets exit, -d passes or SIGINT/SIGTERM.
        Returns CMD's exit status (128 + N when signal N ended it), else 0."""
        try:
            prefix = self._validate()
            source, flags, drv, (attach, skipped, _defs) = build_program(self.opts)
            loader.check_headers()
            # The trace starts before any probe is attached: every event a probe
            # sees is then inside [start_ts_ns, end_ts_ns].
            start = mono_ns()
            probes = loader.Probes(source, flags)
            try:
                self.api = cuda.ApiLayer(self.opts.libcuda)  # API layer: its own BPF object
                try:
                    return self._record(probes, prefix, drv, attach, skipped, start)
                finally:
                    self.api.close()
                    if self.api.guard is not None:
                        self.api.guard.done()
            finally:
                driver_layer.close_quietly(self.driver)
                probes.close()
        finally:
            self._stop_unreleased()

    def _record(
        self,
        probes: loader.Probes,
        prefix: str,
        drv: driver.DriverInfo,
        attach: list[hooks.Hook],
        skipped: list[dict[str, str]],
        start: int,
    ) -> int:
        opts = self.opts
        filtered = bool(opts.pids or opts.command)
        probes.configure(self_tgid=os.getpid(), filter_targets=filtered, prefix=prefix)
        probes.set_uvm_layouts(drv)
        if filtered:  # the API probe stops processes only in filter mode
            self.api.guard = watchdog.Watchdog(self.api.paused_map_fd)
        # The output exists before CMD starts: if it cannot be made, nothing runs.
        writer = TraceWriter(
            opts.output, force=opts.force, rotate_rows=ROTATE_ROWS,
            manifest=self._manifest(prefix, drv, attach, skipped, [], start),
        )  # fmt: skip
        self.writer = writer
        release_fd = -1
        if opts.command:
            release_fd = self._spawn(opts.command)
            assert self.child is not None
            targets = [self.child.pid]
        elif opts.pids:
            targets = sorted({p for pid in opts.pids for p in [pid, *procfs.children(pid)]})
        else:
            targets = []
        writer.update_manifest(target=self._target(targets))
        probes.add_targets(targets)
        self.api.configure(self_tgid=os.getpid(), filter_targets=filtered, pause=filtered)
        self.api.add_targets(targets)
        self.api.start(targets, filtered)
        me = os.getpid()  # the recorder's own device fds are never part of the trace
        seeded = procfs.seed([p for p in (targets if filtered else procfs.all_pids())
                              if p != me], prefix)  # fmt: skip
        probes.seed_fds(seeded)
        self._start_driver(seeded)
        probes.seed_managed(cpufaults.seed(sorted({*targets, *(p for p, _ in seeded)}), prefix))
        for pid in targets if filtered else sorted({p for p, _ in seeded}):
            if self.child is None or pid != self.child.pid:
                self.procs[pid] = procfs.read_info(pid)
        writer.rotate()  # the manifest with its targets, before they run
        if seeded:  # fds open before recording: "seen" rows at the start time
            comms = {p: i.comm for p, i in self.procs.items()}
            writer.append("files", decode.files_batch(decode.seen_events(seeded, start, comms)))
        self._install_signals()
        self._attach_inits(probes)  # UVM_INITIALIZEs seen while setting up
        print(
            f"gputrace: recording ({probes.attached + self.api.count} hooks attached); "
            "Ctrl-C to stop",
            file=sys.stderr,
            flush=True,
        )
        if release_fd >= 0:
            os.write(release_fd, b"go\n")
            os.close(release_fd)
            self.released = True
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
                self._attach_inits(probes)
                self._queue_driver_poll(work)
                for item in self.api.drain():
                    work.put(item)
                self._check_guard()
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
                    self.tracked -= gone  # a reused pid gets a tracker of its own
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
            if self.driver is not None:
                work.put(("driver_stop", None))
            work.put(("drops", {**probes.drops(), **self.api.drops()}))
        finally:
            work.put(None)
            worker.join()
            self._finish_processes(writer)
            ended = self._target_exit()
            if ended is not None:
                writer.update_manifest(target_exit=ended)
            self._driver_manifest(writer)
            writer.update_manifest(end_ts_ns=mono_ns(), decode_errors=dict(self.decode_errors))
            writer.close(status)
        if self.error is not None:
            raise self.error
        return exit_status(ended)

    def _target_exit(self) -> dict[str, Any] | None:
        """How CMD ended (manifest `target_exit`); None without a CMD."""
        if self.child is None:
            return None
        rc = self.child.poll()
        if rc is None:
            return {"status": "running", "code": None, "signal": None, "signal_name": None}
        if rc >= 0:
            return {"status": "exited", "code": rc, "signal": None, "signal_name": None}
        try:
            name: str | None = signal.Signals(-rc).name
        except ValueError:
            name = None
        return {"status": "signaled", "code": None, "signal": -rc, "signal_name": name}

    def _check_guard(self) -> None:
        """A watchdog gone (someone killed it) protects nobody: stop pausing."""
        guard = self.api.guard
        if guard is not None and not guard.alive():
            self.api.guard = None
            self.api.configure(self_tgid=os.getpid(), filter_targets=True, pause=False)
            print("gputrace: warning: the watchdog process exited; processes that load "
                  "libcuda are no longer held until the API probes are attached",
                  file=sys.stderr, flush=True)  # fmt: skip

    def _stop_unreleased(self) -> None:
        """CMD started but recording never began: end it (it is still blocked
        before exec, so it has no children and has run nothing of CMD)."""
        if self.child is not None and not self.released and self.child.poll() is None:
            with contextlib.suppress(OSError):
                self.child.kill()
            self.child.wait()

    def _spawn(self, cmd: list[str]) -> int:
        """Start CMD blocked on a pipe until the probes are attached; return the pipe."""
        r, w = os.pipe()
        self.child = subprocess.Popen([sys.executable, "-c", SHIM, str(r), *cmd], pass_fds=[r])
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
        target = self._target(targets)
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
            "decode_errors": dict(self.decode_errors),
            "start_ts_ns": start,
            "recorder": {"pid": os.getpid(), "argv": sys.argv},
        }

    def _target(self, targets: list[int]) -> dict[str, Any]:
        if self.opts.command:
            return {"mode": "command", "command": self.opts.command, "pids": targets}
        if self.opts.pids:
            return {"mode": "pids", "pids": targets}
        return {"mode": "host"}

    # ------------------------------------------------------------ data
    def _hand_over(self, probes: loader.Probes, work: queue.Queue[Any], flush: bool) -> None:
        """Poll-thread side: pass raw bytes to the writer thread (no decoding here)."""
        if flush:
            probes.flush_staging()
        probes.consume()
        self._attach_inits(probes)
        # process exits last: rows of a process drained with its exit still find it
        for name in sorted(loader.BUFFERS, key=lambda n: n == "proc_events"):
            raw = probes.take(name)
            if raw:
                work.put((name, raw))

    # ------------------------------------------------------------ driver layer
    def _start_driver(self, seeded: dict[tuple[int, int], tuple[int, int]]) -> None:
        """Start the driver layer and attach trackers to processes that already
        hold an initialized nvidia-uvm fd (-p, host mode: procfs seeding found them)."""
        if self.driver is None:
            return
        self.driver.start()
        uvm: dict[int, list[int]] = {}
        for (pid, fd), (kind, _gpu) in sorted(seeded.items()):
            if kind == procfs.DEV_UVM:
                uvm.setdefault(pid, []).append(fd)
        for pid, fds in uvm.items():
            self._attach(pid, fds, already_running=True)

    def _attach_inits(self, probes: loader.Probes) -> None:
        """Attach a tracker to each process whose UVM_INITIALIZE the probes just saw."""
        inits, probes.uvm_inits[:] = list(probes.uvm_inits), []
        if self.driver is None:
            return
        for pid, fd in inits:
            if pid not in self.tracked and pid != os.getpid():
                self._attach(pid, [fd], already_running=False)

    def _attach(self, pid: int, fds: list[int], already_running: bool) -> None:
        assert self.driver is not None
        if not os.path.exists(self.driver.devdir + "/nvidia-uvm-tools"):
            self.no_tracker.add(pid)
            return
        if self.driver.attach(pid, already_running=already_running, fds=fds):
            self.tracked.add(pid)
            self.no_tracker.discard(pid)
            comm = procfs.read_info(pid).comm  # alive now: the tools rows' process name
            if comm is not None:
                self.names[pid] = comm
            print(f"gputrace: driver layer: tracker attached to pid {pid}",
                  file=sys.stderr, flush=True)  # fmt: skip
        else:
            self.no_tracker.add(pid)
            why = next((f["error"] for f in reversed(self.driver.failures)
                        if f["pid"] == pid), "unknown")  # fmt: skip
            print(f"gputrace: warning: driver layer: no tracker on pid {pid}: {why}",
                  file=sys.stderr, flush=True)  # fmt: skip

    def _queue_driver_poll(self, work: queue.Queue[Any]) -> None:
        """At most one driver poll waits in the writer thread's queue at a time."""
        if self.driver is not None and not self._driver_due.is_set():
            self._driver_due.set()
            work.put(("driver", None))

    def _driver_tables(self, writer: TraceWriter, final: bool) -> None:
        """Writer thread: decode what the driver layer drained and append it."""
        assert self.driver is not None
        layer = self.driver
        self._driver_due.clear()
        fetch = layer.stop if final else layer.poll
        try:
            tables = fetch()
        except Exception as e:  # a decoder bug loses that drain, not the recording
            first = str(e).splitlines()[0] if str(e) else ""
            self._skip("uvm_tools", 1, f"{type(e).__name__}: {first}")
            return
        for name, parts in tables.items():
            for part in parts:
                if name == "faults":
                    part = self._with_comm(part)
                self._append(writer, name, "uvm_tools", b"", UVM_RECORD, partial(_ready, part))
        bad = layer.bad_records()
        self._skip("uvm_tools", bad - self._driver_bad, "cut short or unknown codes")
        self._driver_bad = bad

    def _comm(self, pid: int) -> str | None:
        info = self.procs.get(pid)
        return (info.comm if info is not None else None) or self.names.get(pid)

    def _with_comm(self, table: pa.Table) -> pa.Table:
        """Tools-stream fault rows carry no process name: fill `comm` from what the
        recorder knows of the tracked process (its name, not the thread's)."""
        i = table.schema.get_field_index("comm")
        if i < 0 or not table.num_rows or table.column(i).null_count < table.num_rows:
            return table
        pids = table.column("pid")
        pid_list: list[int] = pc.unique(pids).drop_null().to_numpy().tolist()
        names = {p: c for p in pid_list if (c := self._comm(p)) is not None}
        if not names:
            return table
        keys = pa.array(list(names), pa.int32())
        idx = pc.index_in(pids, value_set=keys)
        comm = pc.take(pa.array(list(names.values()), pa.string()), idx)
        return table.set_column(i, table.schema.field(i), comm.cast(table.schema.field(i).type))

    def _driver_manifest(self, writer: TraceWriter) -> None:
        """Merge the driver layer's manifest fragment (layers, drops, clock, facts)."""
        if self.driver is None:
            return
        frag = self.driver.manifest()
        m = writer.manifest
        layers = [*m.get("layers", [])]
        layers += [x for x in frag["layers"] if x not in layers]
        uuids = {g["index"]: g["uuid"] for g in frag["gpu_uuids"]}
        gpus = [{**g, "uuid": uuids[g["index"]]} if g.get("index") in uuids else g
                for g in m.get("gpus", [])]  # fmt: skip
        writer.update_manifest(
            layers=layers,
            drops={**m.get("drops", {}), **frag["drops"]},
            clock={**m.get("clock", {}), **frag["clock"]},
            driver_layer={**frag["driver_layer"], "cpu_fault_source": {
                "uvm_tools_pids": sorted(self.driver.attached_pids()),
                "uvm_pids_without_tracker": sorted(self.no_tracker),
                "tracepoint_rows_dropped": self.cpu_faults_replaced}},
            gpus=gpus,
        )

    def _cpu_faults(self, kind: str, data: bytes) -> tuple[pa.RecordBatch | None, int]:
        """Tracepoint CPU faults, less those of processes with a UVM tools tracker:
        the tools stream is their one CPU-fault source (docs/record.md)."""
        batch, bad = cpufaults.decode_batch(kind, data)
        tracked = list(self.tracked)
        if batch is None or not tracked:
            return batch, bad
        keep = pc.invert(pc.is_in(batch.column("pid"), value_set=pa.array(tracked, pa.int32())))
        kept = batch.filter(pc.fill_null(keep, True))
        self.cpu_faults_replaced += batch.num_rows - kept.num_rows
        return (kept if kept.num_rows else None), bad

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
            self._append(writer, "ioctls", "ioctl_events", data, decode.IOCTL_DTYPE,
                         lambda: self._ioctls(kind, data))  # fmt: skip
        elif kind in ("fault_events", "fault_leftover"):
            self._append(writer, "faults", "fault_events", data, decode_faults.FAULT_DTYPE,
                         lambda: self._cpu_faults(kind, data))  # fmt: skip
        elif kind == "fault_stats":
            writer.update_manifest(cpu_faults=data)
        elif kind in ("driver", "driver_stop"):
            self._driver_tables(writer, kind == "driver_stop")
        elif kind == "mapping_events":
            self._append(writer, "mappings", kind, data, decode.MAPPING_DTYPE,
                         lambda: self._simple(data, decode.MAPPING_DTYPE, MAPPING_CODES,
                                              decode.mappings_batch))  # fmt: skip
        elif kind == "fd_events":
            self._append(writer, "files", kind, data, decode.FD_DTYPE,
                         lambda: self._simple(data, decode.FD_DTYPE, FD_CODES,
                                              decode.files_batch))  # fmt: skip
        elif kind == "proc_events":
            ev, bad = decode.records(data, decode.PROC_DTYPE)
            # the processes table holds int32 pids and int64 times
            ok = ((ev["pid"] <= PID_MAX) & (ev["ppid"] <= PID_MAX) & (ev["tid"] <= PID_MAX)
                  & (ev["ts_ns"] < np.uint64(1 << 63)))  # fmt: skip
            self._skip("proc_events", bad + len(ev) - int(np.count_nonzero(ok)),
                       "cut short or impossible pid/time")  # fmt: skip
            self._proc_events(ev if ok.all() else ev[ok], writer)
        elif kind == "api:cuda_calls":
            self._append(writer, "cuda_calls", cuda.BUFFER, data, decode_cuda.CUDA_DTYPE,
                         lambda: self.api.decode_calls(data))  # fmt: skip
        elif kind.startswith("api:"):
            self.api.write(kind, data, writer)
        elif kind == "rotate":
            writer.update_manifest(drops=data, decode_errors=dict(self.decode_errors))
            self._driver_manifest(writer)
            writer.rotate()
        elif kind == "drops":
            writer.update_manifest(drops=data)
            self._driver_manifest(writer)

    def _append(
        self, writer: TraceWriter, table: str, buffer: str, data: bytes, dtype: np.dtype[Any],
        decode_fn: Callable[[], tuple[pa.RecordBatch | pa.Table | None, int]],
    ) -> None:
        """Decode one chunk of `buffer` and append it. A decoder that raises loses
        that chunk (counted in `decode_errors`), never the recording; the append
        itself (disk full, ...) is not guarded."""
        try:
            batch, bad = decode_fn()
        except Exception as e:
            first = str(e).splitlines()[0] if str(e) else ""
            self._skip(buffer, max(1, len(data) // dtype.itemsize),
                       f"{type(e).__name__}: {first}")  # fmt: skip
            return
        self._skip(buffer, bad, "cut short or unknown codes")
        if batch is not None and batch.num_rows:
            if "pid" in batch.schema.names:
                pids = batch.column("pid").drop_null()
                self._note_pids(pids.to_numpy(zero_copy_only=False))
            writer.append(table, batch)

    def _skip(self, buffer: str, n: int, why: str) -> None:
        if n <= 0:
            return
        if not self.decode_errors.get(buffer):
            print(f"gputrace: warning: skipped {n} {buffer} records the decoder could not "
                  f"read ({why}); counted in the manifest's decode_errors",
                  file=sys.stderr, flush=True)  # fmt: skip
        self.decode_errors[buffer] = self.decode_errors.get(buffer, 0) + n

    @staticmethod
    def _ioctls(kind: str, data: bytes) -> tuple[pa.RecordBatch | None, int]:
        ev, bad = (decode.records(data, decode.IOCTL_DTYPE) if kind == "ioctl_events"
                   else decode.batched(data, decode.IOCTL_DTYPE, decode.STAGE_EVENTS))  # fmt: skip
        ev, unknown = decode.known(ev, IOCTL_CODES)
        return (decode.ioctls_batch(ev) if len(ev) else None), bad + unknown

    @staticmethod
    def _simple(
        data: bytes, dtype: np.dtype[Any], codes: dict[str, dict[int, str]],
        batch_fn: Callable[[Any], pa.RecordBatch],
    ) -> tuple[pa.RecordBatch | None, int]:
        ev, bad = decode.records(data, dtype)
        ev, unknown = decode.known(ev, codes)
        return (batch_fn(ev) if len(ev) else None), bad + unknown

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
            if kind not in (decode.PROC_EXEC, decode.PROC_EXIT, decode.PROC_SEEN,
                            decode.PROC_UVM_INIT):  # fmt: skip
                self._skip("proc_events", 1, f"unknown kind {kind}")
                continue
            # UVM_INIT: the poll thread attached its tracker already (loader); here it
            # only makes the process known, as its ioctl rows would
            info = self.procs.get(pid) or self._new_proc(pid)
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
