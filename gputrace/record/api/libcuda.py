"""The API layer: uprobes/uretprobes on libcuda memory calls (probes/cuda.bpf.c).

Its own bcc object beside the syscall one (bcc comes from loader.import_bcc).
libcuda is found in /proc/PID/maps of the targets (every process in host mode),
in the loader cache (`ldconfig -p`) and from `--libcuda PATH`; a process that
opens a `libcuda.so*` file later is stopped by the probe (SIGSTOP, filter mode
only), the recorder attaches to that file and lets it go (SIGCONT). Uprobes
belong to the inode, so one attach covers every process mapping the library.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from gputrace import schema
from gputrace.errors import GputraceError, UsageError
from gputrace.record import bpf_load, decode, elf, hooks, loader, procfs, python_stacks, ringbuf
from gputrace.record.api import decode as decode_cuda
from gputrace.record.api import watchdog
from gputrace.record.api.discovery import from_ldconfig, from_maps
from gputrace.record.api.extension import Extension, attach_extra
from gputrace.record.api.py_pauses import PyPauseWatch
from gputrace.record.api.symbolize import Symbolizer
from gputrace.record.library_watch import LibraryWatch
from gputrace.record.unwind import tables as unwind

MAIN = "cuda.bpf.c"
BUFFER = "cuda_events"
CUDA_RB_PAGES = 1024  # 4 MiB: ~40k calls between polls
PAUSE_LOAD, PAUSE_FIRST, PAUSE_PY = 1, 2, 4
STOP_WAIT_S = 1.0  # the most a release waits for the probe's SIGSTOP to take effect
PY_WATCH_S = 1.0
"""A stop for a new Python stack alone is the Python-pause thread's (py_pauses.py, the
only reader of its stack) for this long; the drain continues it after, should that
thread have failed."""
STACK_DEPTH = 127  # frames per allocation stack (`record --stack-depth`); the kernel's most
# what sees libcuda loads (the manifest's api.library_loads)
LOADS_TP_BTF = "tp_btf sys_enter/sys_exit (syscall layer)"
LOADS_TRACEPOINT = "syscalls:sys_enter_openat/sys_exit_openat"


def probe_source(probes: Path = loader.PROBES) -> str:
    """The API layer's BPF C text (loader.probe_source of cuda.bpf.c)."""
    return loader.probe_source(probes, MAIN)


def cflags(probes: Path = loader.PROBES, stack_depth: int = STACK_DEPTH) -> list[str]:
    """The API program's compiler flags: its include folder, ring buffer size and
    the most frames each allocation's stack walk reads (--stack-depth)."""
    if not 1 <= stack_depth <= STACK_DEPTH:  # a number, never text, reaches the C source
        raise UsageError(f"--stack-depth must be from 1 to {STACK_DEPTH}, not {stack_depth}")
    return [f"-I{probes}", f"-DGT_CUDA_RB_PAGES={CUDA_RB_PAGES}",
            f"-DGT_CUDA_STACK_DEPTH={int(stack_depth)}", *unwind.cflags()]  # fmt: skip


def program(stack_depth: int = STACK_DEPTH,
            extensions: tuple[Extension, ...] = ()) -> tuple[str, list[str]]:
    """The API program's C text and flags, other layers' probes (`extensions`) included."""
    flags = cflags(stack_depth=stack_depth) + [f for x in extensions for f in x.cflags]
    return probe_source() + "".join("\n" + x.source for x in extensions), flags


def load_program(bcc: Any, probes: Any = None, stack_depth: int = STACK_DEPTH,
                 extensions: tuple[Extension, ...] = ()) -> tuple[Any, str]:
    """The API layer's compiled program, and what sees library loads. Beside a
    syscall layer whose tp_btf program made the maps of probes/cuda_shared.bpf.h
    (`probes.cuda_maps`), it uses those maps and attaches no syscalls:openat
    tracepoint; alone, or if the maps it got are not those, it has its own.
    `extensions`: other layers' probes compiled into it (they share its walks)."""
    shared = tuple(getattr(probes, "cuda_maps", ()))
    source, flags = program(stack_depth, extensions)
    if shared:
        with contextlib.suppress(GputraceError):
            bpf = loader.load_bpf(bcc, source, [*flags, "-DGT_CUDA_EXTERN"],
                                  "api-layer")  # fmt: skip
            ours = [loader.map_id(bpf[n].map_fd) for n in shared]
            if None not in ours and ours == [loader.map_id(probes.bpf[n].map_fd) for n in shared]:
                return bpf, LOADS_TP_BTF
            bpf.cleanup()
    return loader.load_bpf(bcc, source, flags, "api-layer"), LOADS_TRACEPOINT


class LibcudaProbes:
    """The loaded API program, its attachments and its stack symbolizer."""

    def __init__(self, libcuda: str | None = None, probes: Any = None,
                 stack_depth: int = STACK_DEPTH, extensions: tuple[Extension, ...] = ()) -> None:
        self.libcuda = libcuda
        self.stack_depth = stack_depth
        self.extensions = extensions
        self.libraries_watch = LibraryWatch()  # other uprobe layers' libraries
        bcc = loader.import_bcc()
        self.bpf, self.library_loads = load_program(bcc, probes, stack_depth, extensions)
        self._fds, self.comm_cache_note = bpf_load.keep_names(self.bpf, "cuda_task_rename")
        self.raw: list[bytes] = []
        self.rings = ringbuf.RingSet()  # the torch layer's ring is consumed with it
        self.rings.open(self.bpf[BUFFER].map_fd, self.raw.append)
        self.names = {v: k for k, v in hooks.cuda_symbols().items()}
        self.inodes: set[tuple[int, int]] = set()
        self.libraries: list[str] = []
        self.attached: list[str] = []
        self.skipped: list[dict[str, str]] = []
        self.sym = Symbolizer()
        self.py = python_stacks.PythonStacks(self.bpf["cuda_py_procs"], self.bpf["cuda_py_stacks"])
        # the walker's programs load at the first libcuda attached (uretprobe_cuda is
        # most of the API program's verifier time: a host without one never pays it)
        self.unwind = unwind.UnwindTables(self.bpf, unwind.NOT_STARTED)
        self.unwind.compiler.start()
        self.stacks_done: set[tuple[int, int]] = set()
        self.stack_errors = 0
        self.pauses = 0
        self.py_pauses = 0  # stops for a new Python stack (PAUSE_PY)
        self.changed = True
        self.guard: watchdog.Watchdog | None = None  # set before pausing is turned on
        self.filtered = False  # `-p`/CMD: only cuda_targets are served (configure)
        # the drain and the Python-pause thread each take and continue stopped
        # processes: one at a time, so neither continues a stop the other serves
        self.pause_lock = threading.Lock()
        self.py_watch: PyPauseWatch | None = None

    # -- settings
    def configure(self, *, self_tgid: int, filter_targets: bool, pause: bool) -> None:
        tbl = self.bpf["cuda_config"]
        leaf = tbl.Leaf()
        leaf.self_tgid = self_tgid
        leaf.filter = 1 if filter_targets else 0
        leaf.pause = 1 if pause else 0
        leaf.comm_cache = 1 if self._fds else 0
        tbl[ctypes.c_int(0)] = leaf
        self.filtered = filter_targets
        if pause and self.py_watch is None:
            self.py_watch = PyPauseWatch(self, PAUSE_PY)

    def add_targets(self, pids: list[int]) -> None:
        tbl = self.bpf["cuda_targets"]
        for pid in pids:
            tbl[ctypes.c_uint(pid)] = ctypes.c_ubyte(1)

    def start(self, targets: list[int], filtered: bool) -> None:
        """Attach to every libcuda found now; read the maps of targets using it."""
        found: set[str] = set()
        for pid in targets if filtered else procfs.all_pids():
            libs = from_maps(pid)
            if libs:
                found |= libs
                self._refresh(pid)
                self.py.register(pid)
                self.libraries_watch.scan(pid)
        self.unwind.poll(unwind.START_WAIT_S)  # their first allocations walked whole
        found |= from_ldconfig()
        if self.libcuda:
            found.add(self.libcuda)
        for path in sorted(found):
            self.attach(path)

    def attach(self, path: str, shown: str | None = None) -> bool:
        """Uprobes on every probed symbol `path` exports (once per inode)."""
        try:  # one open: the inode kept and the symbols read are one file's
            fd = elf.open_ro(path)
        except OSError:
            return False
        try:
            st = os.fstat(fd)
            key = (st.st_dev, st.st_ino)
            if key in self.inodes:
                return False
            self.inodes.add(key)
            shown = shown or path
            try:
                exported = elf.read(path, fd=fd).exported
            except elf.ElfError as e:
                self.skipped.append({"name": f"uprobe:*@{shown}", "reason": str(e)})
                self.changed = True  # the manifest says why, without waiting for other news
                return False
        finally:
            os.close(fd)
        self.libraries.append(shown)
        bcc = loader.import_bcc()
        if self.unwind.walk == unwind.NOT_STARTED:  # before any uretprobe can run
            self.unwind.walk = unwind.start_walker(bcc, self.bpf)
        if hasattr(self.bpf, "preload"):  # a cached object: its entry probes at once
            self.bpf.preload([f"uprobe_{s}" for s in hooks.cuda_symbols() if s in exported],
                             bcc.BPF.KPROBE)
        # extensions first: the kernel runs a function's newest uretprobe first, so
        # theirs run after the API layer's (a time they stamp is past its return)
        for x in self.extensions:
            self.attached += attach_extra(self.bpf, path, shown, exported, x, self.skipped)
        for sym in hooks.cuda_symbols():
            name = f"uprobe:{sym}@{shown}"
            if sym not in exported:
                self.skipped.append({"name": name, "reason": "symbol not exported"})
                continue
            try:
                self.bpf.attach_uprobe(name=path, sym=sym, fn_name=f"uprobe_{sym}")
                self.bpf.attach_uretprobe(name=path, sym=sym, fn_name="uretprobe_cuda")
            except Exception as e:
                first = str(e).splitlines()[0] if str(e) else type(e).__name__
                self.skipped.append({"name": name, "reason": f"attach failed: {first}"})
                continue
            self.attached += [name, f"uretprobe:{sym}@{shown}"]
        self.changed = True
        return True

    @property
    def count(self) -> int:
        return len(self.attached)

    # -- pauses
    def service_pauses(self) -> list[tuple[int, int, int]]:
        """Handle processes the probes flagged: attach to the libcuda they opened,
        read maps at their first call. Returns (pid, stopped, stop_boot_ns) of each
        one to let go once the drain has read the stacks of their calls (a new
        Python stack's code objects are read while the process is still stopped)."""
        tbl = self.bpf["cuda_paused"]
        items = [(k.value, v.kinds, v.fd, v.stopped, v.stop_boot_ns, v.ts_ns)
                 for k, v in tbl.items()]
        targets = self.bpf["cuda_targets"]
        held: list[tuple[int, int, int]] = []
        young = time.monotonic_ns() - int(PY_WATCH_S * 1e9)
        for pid, kinds, fd, stopped, boot, ts in items:
            if kinds == PAUSE_PY and stopped and ts > young and self.py_watch is not None:
                continue  # the Python-pause thread's
            if self.filtered and ctypes.c_uint(pid) not in targets:
                # not (or no longer) a target: nothing of it is read or attached
                self._release(tbl, pid, stopped, boot)
                continue
            if kinds & PAUSE_LOAD and fd >= 0:
                link = f"/proc/{pid}/fd/{fd}"
                with contextlib.suppress(OSError):
                    target = os.readlink(link)
                    plain = os.path.exists(target) and os.path.samefile(target, link)
                    self.attach(target if plain else link, shown=target)
            if kinds & (PAUSE_FIRST | PAUSE_LOAD):
                # at the load too: the libraries mapped before libcuda (the CUDA
                # runtime, the framework) have their tables before the first call,
                # those compiled within the bounded wait (stopped meanwhile)
                self._refresh(pid, unwind.PAUSE_WAIT_S if stopped else 0.0)
                self.libraries_watch.scan(pid)
            self.py.register(pid)  # stopped (filter mode): its threads are read as they are
            if stopped:
                self.pauses += 1
                self.py_pauses += bool(kinds & PAUSE_PY)
            held.append((pid, stopped, boot))
        return held

    def release(self, held: list[tuple[int, int, int]]) -> None:
        """Let go the processes `service_pauses` returned."""
        tbl = self.bpf["cuda_paused"]
        for pid, stopped, boot in held:
            self._release(tbl, pid, stopped, boot)

    def _refresh(self, pid: int, wait_s: float = 0.0) -> None:
        """Read `pid`'s mappings: for symbols, and unwind tables for its libraries
        built without frame pointers (loaded as they are compiled, up to `wait_s`
        waited for)."""
        if self.sym.refresh(pid):
            self.unwind.update(pid, self.sym.maps[pid], wait_s)

    def _release(self, tbl: Any, pid: int, stopped: int, boot: int) -> None:
        """Take `pid` out of the map and continue it if the probe stopped it. The
        entry goes first (its next pause must find none); the watchdog holds the
        pid meanwhile, in case the recorder dies in between."""
        if stopped and self.guard is not None:
            self.guard.hold(pid, boot)
        with contextlib.suppress(KeyError):
            del tbl[ctypes.c_uint(pid)]
        if stopped:
            # the stop may not have taken effect yet (a Python pause is served the
            # moment the probe asks for it): continued too early, it would stay
            watchdog.wait_stopped(pid, STOP_WAIT_S)
            watchdog.continue_stopped(pid, boot)
            if self.guard is not None:
                self.guard.forget(pid)

    def forget(self, gone: set[int]) -> None:
        """Drop the stacks and symbols of exited processes: a recorder that runs
        for hours on a host whose processes come and go keeps bounded memory."""
        self.stacks_done = {k for k in self.stacks_done if k[0] not in gone}
        for pid in gone:
            self.sym.forget(pid)
            self.py.forget(pid)
            self.unwind.forget(pid)

    def resume_all(self) -> None:
        """Continue everyone stopped now. Entries are removed one by one, never
        cleared at once: a stop the probe makes meanwhile stays in the map, where
        the watchdog finds it once the programs are detached."""
        tbl = self.bpf["cuda_paused"]
        for k, v in list(tbl.items()):
            self._release(tbl, k.value, v.stopped, v.stop_boot_ns)

    @property
    def paused_map_fd(self) -> int:
        """Descriptor of the `cuda_paused` map (for the watchdog)."""
        return int(self.bpf["cuda_paused"].map_fd)

    # -- data
    def drain(self) -> list[tuple[str, Any]]:
        """Work items for the writer: raw events, stack rows, manifest facts."""
        with self.pause_lock:
            return self._drain()

    def _drain(self) -> list[tuple[str, Any]]:
        held = self.service_pauses()
        items: list[tuple[str, Any]] = []
        try:
            if self.unwind.poll():
                self.changed = True  # the manifest lists the tables
            # after the paused map was read: the calls that stopped a process are in
            # the ring already (each is submitted before its stop)
            self.rings.consume()
            if self.raw:
                data = b"".join(self.raw)
                self.raw.clear()
                items.append(("api:cuda_calls", data))
                rows = self._stacks(decode.records(data, decode_cuda.CUDA_DTYPE)[0])
                if rows:
                    items.append(("api:stacks", rows))
        finally:
            self.release(held)
        if self.changed or items:
            self.changed = False
            items.append(("api:manifest", self.manifest()))
        return items

    def stack_rows(self, ev: np.ndarray[Any, Any]) -> list[dict[str, Any]]:
        """`stacks` rows of the events `ev` (fields pid, stack_id, py_stack_id) not
        handed over before: for the layers compiled into this program."""
        return self._stacks(ev)

    def _stacks(self, ev: np.ndarray[Any, Any]) -> list[dict[str, Any]]:
        sid, py = ev["stack_id"].astype(np.int64), ev["py_stack_id"].astype(np.int64)
        self.stack_errors += int(((sid < 0) & (sid != -1)).sum() + ((py < 0) & (py != -1)).sum())
        key = python_stacks.stack_keys(sid, py)
        ok = key >= 0
        rows: list[dict[str, Any]] = []
        tbl = self.bpf["cuda_stacks"]
        for pid, stack_id in set(zip(ev["pid"][ok].tolist(), key[ok].tolist(), strict=True)):
            if (pid, stack_id) in self.stacks_done:
                continue
            self.stacks_done.add((pid, stack_id))
            native_id, py_id = python_stacks.split_key(stack_id)
            try:
                ips: list[int] = []
                if native_id >= 0:
                    st = tbl[tbl.Key(native_id)]
                    # frames up to the first 0, as the kernel's stack map gave them
                    ips = [int(ip) for ip in itertools.takewhile(bool, st.ip[: st.n])]
                    self.unwind.saw_stack(pid, ips)
                frames = self.sym.stack_rows(pid, stack_id, ips)
                if py_id >= 0:
                    frames = python_stacks.merge(pid, stack_id, frames,
                                                 self.py.frames_of(pid, py_id))
            except Exception:
                self.stack_errors += 1
                continue
            rows += [{"kind": "native", **r} for r in frames]
            # a library loaded since (the symbolizer read the maps again): its table
            if pid in self.sym.maps:
                self.unwind.update(pid, self.sym.maps[pid])
        return rows

    def drops(self) -> dict[str, int]:
        return {BUFFER: int(sum(self.bpf["cuda_drops"][ctypes.c_int(0)]))}

    def manifest(self) -> dict[str, Any]:
        return {
            "libraries": list(self.libraries),
            "attached": list(self.attached),
            "skipped": list(self.skipped),
            "stack_frames": self.sym.frames,
            "unresolved_frames": self.sym.unresolved,
            "symbols_skipped": [{"module": k, "reason": v}
                                for k, v in sorted(self.sym.skipped.items())],
            "stack_errors": self.stack_errors,
            "pauses": self.pauses,
            "stack_depth": self.stack_depth,
            "python": {"versions": self.py.versions(), "frames": self.py.frames,
                       "unknown_frames": self.py.unknown,
                       "unknown_reasons": dict(self.py.unknown_reasons),
                       "pauses": self.py_pauses,
                       "warnings": sorted(self.py.warnings.values())},
            "library_loads": self.library_loads,
            "comm_cache": self.comm_cache_note,
            "unwind": self.unwind.manifest(),
        }

    def decode_calls(self, data: bytes) -> tuple[pa.RecordBatch | None, int]:
        """`api:cuda_calls` bytes as a `cuda_calls` batch (None when empty), and the
        records skipped as unreadable (cut short, or a function id not probed)."""
        ev, bad = decode.records(data, decode_cuda.CUDA_DTYPE)
        ev, unknown = decode.known(ev, {"func": self.names})
        batch = decode_cuda.cuda_calls_batch(ev, self.names) if len(ev) else None
        return batch, bad + unknown

    def write(self, kind: str, data: Any, writer: Any) -> None:
        """Writer-thread side of the items `drain` made (calls: see `decode_calls`)."""
        if kind == "api:stacks":
            writer.append("stacks", pa.Table.from_pylist(data, schema=schema.STACKS.arrow_schema))
        elif kind == "api:manifest":
            m = writer.manifest
            h = m.get("hooks", {"attached": [], "skipped": []})
            keep = [x for x in h["attached"] if not str(x).startswith(("uprobe:", "uretprobe:"))]
            skip = [x for x in h["skipped"] if not str(x.get("name", "")).startswith("uprobe:")]
            layers = list(m.get("layers", []))
            if data["attached"] and "api" not in layers:
                layers.append("api")
            writer.update_manifest(
                layers=layers,
                hooks={**h, "attached": keep + data["attached"], "skipped": skip + data["skipped"]},
                api={k: v for k, v in data.items() if k not in ("attached", "skipped")},
            )

    def close(self) -> None:
        if self.py_watch is not None:
            self.py_watch.close()
            self.py_watch = None
        self.unwind.close()
        with contextlib.suppress(Exception):
            self.resume_all()
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = []
        self.rings.close()
        self.bpf.cleanup()
