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
import uuid
from pathlib import Path
from types import FrameType
from typing import Any

from gputrace import schema
from gputrace.errors import GputraceError, UsageError
from gputrace.identity import Identity
from gputrace.record import bpf_cache, hooks, loader, procfs, reap, startup
from gputrace.record.freeze import Freezer
from gputrace.record.held_open import HeldOpen
from gputrace.record.layers import RECORDER_LAYERS, Due, Layer
from gputrace.record.options import (
    MAX_DURATION_S,
    SPILL_DEFAULT_MIB,
    Options,
    build_program,
    check_command,
    check_output_dir,
    check_privileges,
    device_prefix,
    exit_status,
    spill_bytes,
)
from gputrace.record.session import Observer, Session, Stats, merged
from gputrace.record.syscall.layer import PID_MAX
from gputrace.render.safe import printable
from gputrace.trace.files import STATUS_COMPLETE
from gputrace.trace.flight import FlightWriter
from gputrace.trace.writer import TraceWriter

__all__ = ["MAX_DURATION_S", "PID_MAX", "Options", "Recorder", "Stats", "build_program",
           "exit_status"]

POLL_S = 0.05
ROTATE_S = 1.0
ROTATE_ROWS = 1_000_000
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


def _size(data: Any) -> int:
    """Bytes of a work item (raw buffers; 0 for anything else)."""
    return len(data) if isinstance(data, bytes | bytearray | memoryview) else 0


def mono_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


class Recorder:
    """One recording: start (validate, load and attach the layers, start or seed the
    targets), poll (drain the layers every POLL_S, rotate every ROTATE_S), finish
    (final drains, processes, manifest). The layers are `layers.RECORDER_LAYERS`."""

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.stop_reason: str | None = None
        self.child: subprocess.Popen[bytes] | None = None
        self.held = HeldOpen()  # after CMD exits: its processes holding its files
        self.released = False  # CMD was let go past its start gate
        self.error: BaseException | None = None
        self.layers: list[Layer] = []
        self.session: Session | None = None
        self._observers: list[Observer] = []
        self._prepared: dict[str, Any] = {}  # what each layer's validate returned
        self._release_fd = -1  # CMD's start gate
        self._child_info = procfs.ProcInfo(0)  # CMD's process facts, set by _spawn
        self.cmd_info: tuple[str | None, str | None, str | None] = (None, None, None)
        self._spill = SPILL_DEFAULT_MIB << 20  # set by _validate
        self.freezer = Freezer(opts.flight, lambda: self.session and self.session.writer,
                               self.identity_of)
        if opts.flight.freeze_on:  # an observer: what it watches is decoded, never spilled
            self._observers.append(self.freezer.observe)

    # ------------------------------------------------------------ live consumers
    def add_observer(self, callback: Observer) -> None:
        """Call `callback(table_name, rows)` with every decoded Arrow table right after
        it is appended to the trace (from the writer thread: keep it short). An
        exception in it is counted (`stats().observer_errors`), printed once, and
        never ends the recording. Add observers before `run()`."""
        self._observers.append(callback)

    def identity_of(self, pid: int) -> Identity | None:
        """The container and pod of process `pid` as recorded so far (writer thread, as
        observers are), or None when it is not known."""
        info = self.session.procs.get(pid) if self.session is not None else None
        return info.identity if info is not None else None

    def stats(self) -> Stats:
        """A snapshot: rows per table, drops as of the last rotation, decode errors,
        observer errors, the recorder's CPU time and RSS. Safe from any thread."""
        if self.session is None:
            return Stats({}, {}, {}, 0, 0.0, 0)
        return self.session.stats()

    # ------------------------------------------------------------ start
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
        self._spill = spill_bytes()
        check_privileges()
        check_output_dir(opts.output, opts.force)
        for pid in opts.pids:
            if not procfs.is_alive(pid):
                raise UsageError(f"-p {pid}: no such process")
        if opts.command:
            check_command(opts.command[0])
        prefix = device_prefix(opts.device_dir)
        for cls in RECORDER_LAYERS:
            self._prepared[cls.name] = cls.validate(opts, prefix)
        return prefix

    def _driver_layer(self, prefix: str) -> Any:
        """The driver layer `validate` would build for this device folder (None: off)."""
        from gputrace.record.driver_layer.layer import DriverLayer

        return DriverLayer.validate(self.opts, prefix)

    def run(self) -> int:
        """Record until CMD exits, the -p targets exit, -d passes or SIGINT/SIGTERM.
        Returns CMD's exit status (128 + N when signal N ended it), else 0."""
        self._caches = startup.Caches(off=self.opts.no_cache)
        try:
            prefix = self._validate()
            source, flags, drv, (attach, skipped, _defs) = build_program(self.opts)
            loader.check_headers()
            # The trace starts before any probe is attached: every event a probe
            # sees is then inside [start_ts_ns, end_ts_ns].
            s = Session(self.opts, prefix, drv, attach, skipped, mono_ns(),
                        filtered=bool(self.opts.pids or self.opts.command),
                        program=(source, flags), observers=self._observers,
                        spill_bytes=self._spill)  # fmt: skip
            self.session = s
            try:
                startup.build_layers(s, self._prepared, self.layers, RECORDER_LAYERS)
                return self._record(s)
            finally:
                for layer in reversed(self.layers):
                    with contextlib.suppress(Exception):
                        layer.close(s)
        finally:
            self._stop_unreleased()
            self._caches.close()

    def _record(self, s: Session) -> int:
        self._start(s)
        work: queue.Queue[tuple[Layer | None, str, Any] | None] = queue.Queue()
        worker = threading.Thread(target=self._worker, args=(work, s), daemon=True)
        worker.start()
        status = STATUS_COMPLETE
        try:
            self._poll(s, work)
            self._drain(s, work, Due.FINAL)
        finally:
            work.put(None)
            worker.join()
            ended = self._finish(s, status)
        if self.error is not None:
            raise self.error
        return exit_status(ended)

    def _start(self, s: Session) -> None:
        """Configure and attach every layer, start or find the targets, seed what
        was running before, write the first part; then CMD may run."""
        opts = self.opts
        for layer in self.layers:
            layer.configure(s)
        # The output exists before CMD starts: if it cannot be made, nothing runs.
        kw: dict[str, Any] = {"force": opts.force, "rotate_rows": ROTATE_ROWS,
                              "manifest": self._manifest(s)}
        s.writer = (FlightWriter(opts.output, keep=opts.flight.keep, rotate_s=ROTATE_S,
                                 grace_ns=int(ROTATE_S * 1e9), **kw)
                    if opts.flight.wanted else TraceWriter(opts.output, **kw))  # fmt: skip
        self._release_fd = -1
        if opts.command:
            self._release_fd = self._spawn(opts.command)
            assert self.child is not None
            s.procs[self.child.pid] = self._child_info
            self._child_info.identity = s.node.named(self._child_info.identity)
            s.child, s.cmd_info = self.child, self.cmd_info
            s.targets = [self.child.pid]
        elif opts.pids:
            s.targets = sorted({p for pid in opts.pids for p in [pid, *procfs.children(pid)]})
        s.w.update_manifest(target=self._target(s.targets))
        for layer in self.layers:
            layer.attach(s)
        me = os.getpid()  # the recorder's own device fds are never part of the trace
        s.seeded = procfs.seed([p for p in (s.targets if s.filtered else procfs.all_pids())
                                if p != me], s.prefix)  # fmt: skip
        for pid in s.targets if s.filtered else sorted({p for p, _ in s.seeded}):
            if self.child is None or pid != self.child.pid:
                s.procs[pid] = procfs.read_info(pid, node=s.node)
        s.w.rotate()  # the manifest with its targets, before they run
        s.checkpoint_procs()
        for layer in self.layers:
            layer.seed(s)
        self._install_signals()
        self._drain_inits(s)  # UVM_INITIALIZEs seen while setting up
        print(f"gputrace: recording ({sum(ly.hooks for ly in self.layers)} hooks attached); "
              "Ctrl-C to stop", file=sys.stderr, flush=True)  # fmt: skip
        if self._release_fd >= 0:
            os.write(self._release_fd, b"go\n")
            os.close(self._release_fd)
            self.released = True

    def _drain_inits(self, s: Session) -> None:
        for layer in self.layers:
            layer.collect(s, Due.POLL)
        s.uvm_inits.clear()

    # ------------------------------------------------------------ poll
    def _poll(self, s: Session, work: queue.Queue[Any]) -> None:
        """Every POLL_S: drain the layers and check the stop conditions; every
        ROTATE_S: flush, drain everything, rotate, forget exited processes."""
        opts = self.opts
        deadline = None if opts.duration_s is None else time.monotonic() + opts.duration_s
        next_rotate = time.monotonic() + ROTATE_S
        while self.stop_reason is None and self.error is None:
            time.sleep(POLL_S)
            now = time.monotonic()
            rotate = now >= next_rotate
            self._drain(s, work, Due.ROTATE if rotate else Due.POLL)
            # CMD's exit ends it once no child of it holds its device files
            if (self.child is not None and self.child.poll() is not None
                    and not self.held.holding(s)):
                self.stop_reason = "command exited"
            elif opts.pids and not any(procfs.is_alive(p) for p in s.targets):
                self.stop_reason = "targets exited"
            elif deadline is not None and now >= deadline:
                self.stop_reason = "duration"
            if rotate:
                next_rotate = now + ROTATE_S
                work.put((None, "rotate", None))
                gone, s.exited = s.exited, set()
                for layer in self.layers:
                    layer.housekeep(s, gone)

    def _drain(self, s: Session, work: queue.Queue[Any], due: Due) -> None:
        """Poll-thread side: every layer takes its data in, then hands the writer
        thread raw items (no decoding here); items marked `last` go after the rest."""
        for layer in self.layers:
            layer.collect(s, due)
        s.uvm_inits.clear()
        s.watch_procs()  # before the writer thread, which may decode a second later
        late = []
        for layer in self.layers:
            for kind, data in layer.drain(s, due):
                s.backlog(_size(data))
                buf = layer.BUFFERS.get(kind)
                if buf is not None and buf.last:
                    late.append((layer, kind, data))
                else:
                    work.put((layer, kind, data))
        for item in late:
            work.put(item)
        s.procs_taken()

    # ------------------------------------------------------------ writer thread
    def _worker(self, work: queue.Queue[tuple[Layer | None, str, Any] | None], s: Session) -> None:
        """Writer thread: decode in bulk, append, rotate (Arrow and zstd release the GIL)."""
        while (item := work.get()) is not None:
            s.backlog(-_size(item[2]))
            if self.error is not None:
                continue
            try:
                self._handle(s, *item)
            except BaseException as e:
                self.error = e

    def _handle(self, s: Session, layer: Layer | None, kind: str, data: Any) -> None:
        if layer is None:  # "rotate"
            self._merge_manifests(s)
            s.w.rotate()
            s.checkpoint_procs()  # after the parts: a process that exited is in them
            return
        buf = layer.BUFFERS.get(kind)
        if buf is not None:
            s.decode(layer, buf, kind, data)
        else:
            layer.write(s, kind, data)

    def _merge_manifests(self, s: Session) -> None:
        for layer in self.layers:
            s.merge_manifest(layer.manifest(s, s.w.manifest))
        s.w.update_manifest(decode_errors=dict(s.decode_errors))

    # ------------------------------------------------------------ finish
    def _finish(self, s: Session, status: str) -> dict[str, Any] | None:
        """Processes still alive, how CMD ended, the layers' last manifest facts."""
        s.finish_processes()
        ended = self._target_exit()
        if ended is not None:
            s.w.update_manifest(target_exit=ended)
        self._merge_manifests(s)
        s.w.update_manifest(end_ts_ns=mono_ns())
        if left := reap.take_left():  # helpers the kernel would not let go (on stderr)
            s.w.update_manifest(helpers_left=left)
        s.w.close(status)
        if self.opts.raw:
            # the operator's -o, but a terminal acts on what a path may hold
            print(f"gputrace: ioctl events were written undecoded (--raw): run "
                  f"`gputrace convert {printable(s.w.path)}` before reading the trace",
                  file=sys.stderr, flush=True)  # fmt: skip
        elif s.w.raw_parts_written:
            self._convert_spilled(s)
        return ended

    def _convert_spilled(self, s: Session) -> None:
        """Decode what was written raw while the writer thread was behind (the
        targets are done or no longer watched: this costs them nothing)."""
        from gputrace.importers.raw import convert

        n = s.w.raw_parts_written
        print(f"gputrace: decoding {n} parts written undecoded while the recorder was "
              "behind", file=sys.stderr, flush=True)  # fmt: skip
        t0 = time.process_time()
        try:
            done = convert(s.w.path)
            print(f"gputrace: decoded {done.parts} parts ({done.rows} rows) in "
                  f"{time.process_time() - t0:.2f} s of CPU", file=sys.stderr, flush=True)
        except (GputraceError, OSError) as e:
            print(f"gputrace: warning: {printable(e)}; the trace keeps them: run "
                  f"`gputrace convert {printable(s.w.path)}`", file=sys.stderr,
                  flush=True)  # fmt: skip

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
        self._child_info = info
        self.cmd_info = (info.comm, info.exe, info.cmdline)
        return w

    def _install_signals(self) -> None:
        def handler(signum: int, _frame: FrameType | None) -> None:
            self.stop_reason = signal.Signals(signum).name

        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)

    def _manifest(self, s: Session) -> dict[str, Any]:
        """The first manifest: host, driver, GPUs, clock, hooks; each layer adds its
        fragment (layers, drops) on top."""
        uname = platform.uname()
        gpus = sorted(
            (k[1], str(Path(s.prefix) / name))
            for name in os.listdir(s.prefix)
            if (k := procfs.device_kind(name)) is not None and k[0] == schema.DEV_GPU
        )
        drv = s.drv
        m: dict[str, Any] = {
            "trace_id": str(uuid.uuid4()),  # fleet datasets name the trace's files by it
            "host": {"hostname": socket.gethostname(), "kernel": uname.release,
                     "machine": uname.machine},
            "driver_version": drv.version,
            "driver": {"version": drv.version, "source": drv.source,
                       "layouts_of": drv.layout_version},
            "gpus": [{"index": i, "path": p} for i, p in gpus],
            "device_dir": s.prefix,
            "clock": {"source": "CLOCK_MONOTONIC",
                      "realtime_offset_ns": time.time_ns() - mono_ns()},
            "target": self._target([]),
            "layers": [],
            "hooks": {"attached": [h.name for h in s.attach_plan], "skipped": s.skipped_hooks,
                      "notes": hooks.notes()},
            "drops": {},
            "decode_errors": dict(s.decode_errors),
            "start_ts_ns": s.start_ns,
            "recorder": {"pid": os.getpid(), "argv": sys.argv,
                         "bpf_objects": dict(bpf_cache.used)},
        }  # fmt: skip
        for layer in self.layers:
            m.update(merged(m, layer.manifest(s, m)))
        return m

    def _target(self, targets: list[int]) -> dict[str, Any]:
        if self.opts.command:
            return {"mode": "command", "command": self.opts.command, "pids": targets}
        if self.opts.pids:
            return {"mode": "pids", "pids": targets}
        return {"mode": "host"}
