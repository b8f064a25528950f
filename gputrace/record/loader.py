"""Builds the syscall layer's BPF source and settings, attaches it, and talks
to its maps and ring buffers (Probes). bcc is found here (import_bcc) before
anything imports it; compiling and loading are bpf_load.py's stage.

bcc is not a pip dependency: it is the distribution's package (Debian/Ubuntu
`python3-bpfcc`, RHEL `python3-bcc`), found at run time, if need be by adding
the system dist-packages directory to `sys.path`.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.resources
import os
import platform
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gputrace.errors import GputraceError
from gputrace.record import decode, hooks, ringbuf
from gputrace.record.bpf_load import attach_tp_btf, keep_names, load_tp_btf
from gputrace.record.bpf_load import check_headers as check_headers  # re-exported
from gputrace.record.bpf_load import load_bpf as load_bpf
from gputrace.record.bpf_object import detach_parallel
from gputrace.record.cpu_faults import decode as decode_faults
from gputrace.record.driver_version import DriverInfo, slot

MAIN = "syscalls.bpf.c"


def probes_dir() -> Path:
    """Which directory holds the BPF C sources: the checkout's probes/ when gputrace
    runs from a source tree (no install, or an editable one), else the installed
    package's `gputrace.probes` (package data; setup.py maps probes/ to it). The source
    tree comes first: an editable install of another checkout would otherwise supply
    its probes to this one's code. A path, never an error: probe_source says what is
    missing when it is used."""
    tree = Path(__file__).resolve().parent.parent.parent
    if (tree / "pyproject.toml").is_file() and (tree / "probes" / MAIN).is_file():
        return tree / "probes"
    try:
        found = importlib.resources.files("gputrace.probes")
    except ModuleNotFoundError:
        return tree / "probes"
    # bcc compiles from files (-I): sources inside a zip could not be used as they are
    return found if isinstance(found, Path) else tree / "probes"


PROBES = probes_dir()
FLUSH_CMD = 0x47545246
IOCTL_RB_PAGES = 16384  # 64 MiB: ~0.4 s of events at 1 M/s
FAULT_RB_PAGES = 8192  # 32 MiB: ~0.6 s of CPU faults at 1 M/s
# ring buffers of the syscall program, in GT_BUF_* order (their index in `drops`)
BUFFERS = ("ioctl_events", "mapping_events", "proc_events", "fault_events", "fd_events")
STAGED = ("ioctl_events", "fault_events")  # records are count-prefixed batches
FAULT_STATS = ("untracked_blocks", "untracked_ranges")  # `fault_stats` slots, GT_FS_* order
# tp_btf programs of syscall_hooks.bpf.h: (function, kernel tracepoint, needs define)
TP_BTF = (("gt_sys_enter", "sys_enter", None), ("gt_sys_exit", "sys_exit", None),
          ("gt_page_fault_user", "page_fault_user", "GT_HAVE_PAGE_FAULT_USER"))  # fmt: skip
# -D defines of the tp_btf program: the dispatchers, and the API layer's library-load
# check in their openat (probes/cuda_shared.bpf.h), whose maps it shares by name
TP_BTF_FLAGS = ("-DGT_TP_BTF", "-DGT_CUDA_SHARE")
CUDA_SHARED_MAPS = ("cuda_config", "cuda_targets", "cuda_paused")
# tail programs of gt_sys_exit, in their exit_tails slot order (GT_TAIL_*)
TP_BTF_TAILS = ("gt_exit_mmap", "gt_exit_munmap")
# How the syscall probes attach: "tracepoint" (the default), "auto" (tp_btf, else
# tracepoints) or "tp_btf" (or fail). tp_btf is not the default: the kernel runs
# its sys_enter/sys_exit programs for every syscall of the host, and on the 6.18
# VM measured (benchmarks/untraced, 2026-12-01, no syscalls:* tracepoint left
# with tp_btf) getpid paid +146..236 ns against +78..122 with the per-syscall
# tracepoints (null programs alone: +94..165 against +63..86), while tp_btf
# saved ~100..190 ns per untraced ioctl and ~270 ns per traced one (+726 against
# +997): most syscalls of a host are neither.
HOOKS_ENV = "GPUTRACE_SYSCALL_HOOKS"
HOOKS_DEFAULT = "tracepoint"
_SYSTEM_DIST = "/usr/lib/python3/dist-packages"
_INCLUDE_RE = re.compile(r'^#include "([\w.]+\.bpf\.h)"\s*$')


def probe_source(probes: Path = PROBES, main: str = MAIN) -> str:
    """The BPF C text of `main` (the syscall layer's by default; api/libcuda.py: the
    API layer's), with its `*.bpf.h` parts inlined, each once (bcc only finds
    TRACEPOINT_PROBEs in the main text); gputrace_events.h stays an include."""
    if not (probes / main).is_file():
        raise GputraceError(
            f"the BPF sources are missing ({probes / main}): this gputrace install is "
            "incomplete; reinstall it, or run it from a checkout"
        )
    done: set[str] = set()

    def inline(name: str) -> str:
        done.add(name)
        out = []
        for line in (probes / name).read_text().splitlines(keepends=True):
            m = _INCLUDE_RE.match(line)
            if m:
                out.append(inline(m.group(1)) if m.group(1) not in done else "")
            else:
                out.append(line)
        return "".join(out)

    return inline(main)


def cflags(driver: DriverInfo, hook_defines: Iterable[str], probes: Path = PROBES) -> list[str]:
    """Compiler flags: include dir and validated -D defines (integers and names only)."""
    flags = [f"-I{probes}", f"-DGT_IOCTL_RB_PAGES={IOCTL_RB_PAGES}",
             f"-DGT_FAULT_RB_PAGES={FAULT_RB_PAGES}", f"-DGT_TGID_WORDS={tgid_words()}"]
    for name, value in sorted(driver.defines.items()):
        if not re.fullmatch(r"GT_[A-Z0-9_]+", name) or not isinstance(value, int):
            raise GputraceError(f"internal error: bad define {name}={value!r}")
        flags.append(f"-D{name}={value}")
    for d in hook_defines:
        if not re.fullmatch(r"GT_HAVE_[A-Z0-9_]+", d):
            raise GputraceError(f"internal error: bad define {d}")
        flags.append(f"-D{d}")
    return flags


def tgid_words(pid_max_file: Path = Path("/proc/sys/kernel/pid_max")) -> int:
    """Entries of the `known_tgids` filter (64 tgids each) covering pid_max."""
    try:
        pid_max = int(pid_max_file.read_text())
    except (OSError, ValueError):
        pid_max = 1 << 22  # the kernel's upper limit on 64-bit
    return max(1, min(pid_max, 1 << 22) + 63) // 64


def map_id(fd: int) -> int | None:
    """The kernel's id of the BPF map behind `fd` (two fds, one map: same id)."""
    return ringbuf.fdinfo_field(fd, "map_id")


def import_bcc() -> Any:
    """The bcc module, or a one-line error with the install hints."""
    try:
        import bcc
    except ImportError:
        if os.path.isdir(os.path.join(_SYSTEM_DIST, "bcc")):
            if _SYSTEM_DIST not in sys.path:  # (another thread may have added it)
                sys.path.append(_SYSTEM_DIST)
            try:
                import bcc
            except ImportError as e:
                raise GputraceError(f"bcc is installed but does not import: {e}") from None
        else:
            raise GputraceError(
                "bcc (BPF Compiler Collection) Python module not found: install it with "
                "`apt-get install python3-bpfcc` (Debian/Ubuntu) or "
                "`dnf install python3-bcc` (RHEL/Fedora)"
            ) from None
    return bcc


class Probes:
    """The loaded programs and their maps."""

    def __init__(self, source: str, flags: list[str]) -> None:
        bcc = import_bcc()
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fds: list[int] = []  # tp_btf programs and links (bcc does not know them)
        self._links = 0
        self._flags = list(flags)
        # the API layer's maps this program made for it (cuda_shared.bpf.h): with
        # tp_btf the dispatcher sees libcuda loads, so no syscalls:* tracepoint stays
        self.cuda_maps: tuple[str, ...] = ()
        self.hooks = self._load(bcc, source, flags)
        fds, self.hooks["comm_cache"] = keep_names(self.bpf, "gt_task_rename")
        self._fds += fds
        self.comm_cache = bool(fds)
        self.raw: dict[str, list[bytes]] = {name: [] for name in BUFFERS}
        self._received: dict[str, list[int]] = {name: [0] for name in BUFFERS}
        # (pid, uvm fd) of each UVM_INITIALIZE that succeeded, as the callback saw
        # it: the recorder attaches the driver layer's tracker before decoding
        self.uvm_inits: list[tuple[int, int]] = []
        self._callbacks = [self._collector(name) for name in BUFFERS]
        self.rings = ringbuf.RingSet()
        for name, cb in zip(BUFFERS, self._callbacks, strict=True):
            self.rings.open(self.bpf[name].map_fd, cb)

    def _load(self, bcc: Any, source: str, flags: list[str]) -> dict[str, str]:
        """Compile and attach; returns the manifest's `syscall_hooks`: which
        mechanism ran (tp_btf or tracepoint) and why the fallback, if taken."""
        want = os.environ.get(HOOKS_ENV, HOOKS_DEFAULT)
        if want not in ("auto", "tp_btf", "tracepoint"):
            raise GputraceError(f"{HOOKS_ENV}={want!r}: use auto, tp_btf or tracepoint")
        reason = f"{HOOKS_ENV}={want}" if HOOKS_ENV in os.environ else "the default"
        if want != "tracepoint" and platform.machine() != "x86_64":
            reason = "tp_btf programs read x86-64 syscall registers"
        elif want != "tracepoint":
            try:
                bpf = load_bpf(bcc, source, [*flags, *TP_BTF_FLAGS], "syscall-layer")
            except GputraceError as e:
                if want == "tp_btf":
                    raise
                return self._load_tracepoints(bcc, source, flags, str(e))
            try:
                tails = bpf[b"exit_tails"]
                for i, func in enumerate(TP_BTF_TAILS):
                    fd = load_tp_btf(bpf, func, "sys_exit")
                    self._fds.append(fd)
                    tails[ctypes.c_int(i)] = ctypes.c_int(fd)
                for func, tp, needs in TP_BTF:
                    if needs is None or f"-D{needs}" in flags:
                        fd = load_tp_btf(bpf, func, tp)
                        self._fds.append(fd)
                        self._fds.append(attach_tp_btf(fd, tp))
                        self._links += 1
                self.bpf = bpf
                self.cuda_maps = CUDA_SHARED_MAPS
                return {"mechanism": "tp_btf"}
            except GputraceError as e:
                self._close_fds()
                bpf.cleanup()
                if want == "tp_btf":
                    raise
                reason = str(e)
        return self._load_tracepoints(bcc, source, flags, reason)

    def _load_tracepoints(self, bcc: Any, source: str, flags: list[str],
                          reason: str) -> dict[str, str]:  # fmt: skip
        self.bpf = load_bpf(bcc, source, flags, "syscall-layer")
        return {"mechanism": "tracepoint", "reason": reason}

    def _close_fds(self) -> None:
        for fd in reversed(self._fds):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()
        self._links = 0

    def _collector(self, name: str) -> Any:
        """A callback that only copies bytes (ioctl batches: without their header)."""
        sink = self.raw[name]
        skip = decode.BATCH_HEADER if name in STAGED else 0
        seen = self._received[name]

        def cb(data: bytes) -> None:
            sink.append(data[skip:] if skip else data)
            seen[0] += len(data)

        if name != "proc_events":
            return cb
        inits = self.uvm_inits
        fields = decode.PROC_DTYPE.fields
        assert fields is not None
        size_ok = decode.PROC_DTYPE.itemsize
        kind_at, pid_at, fd_at = (fields[f][1] for f in ("kind", "pid", "exit_code"))

        def proc_cb(raw: bytes) -> None:
            sink.append(raw)
            if len(raw) == size_ok and (
                int.from_bytes(raw[kind_at : kind_at + 4], "little") == decode.PROC_UVM_INIT
            ):
                pid = int.from_bytes(raw[pid_at : pid_at + 4], "little")
                inits.append((pid, int.from_bytes(raw[fd_at : fd_at + 4], "little", signed=True)))

        return proc_cb

    def received(self, name: str) -> int:
        """Bytes the ring buffer `name` has delivered since the start."""
        return self._received[name][0]

    def pending_bytes(self, name: str) -> int:
        return sum(len(c) for c in self.raw[name])

    @property
    def attached(self) -> int:
        """Hook points served, counted as the manifest lists them: with tp_btf,
        every syscalls:* (and exceptions:*) hook the dispatchers stand for."""
        n = int(self.bpf.num_open_tracepoints())
        if self._links:
            n += sum(1 for h in hooks.HOOKS if h.category in ("syscalls", "exceptions")
                     and (h.required or f"-D{h.define}" in self._flags))  # fmt: skip
        return n

    # -- settings
    def configure(self, *, self_tgid: int, filter_targets: bool, prefix: str) -> None:
        raw = prefix.encode()
        if b"\0" in raw or not 1 < len(raw) <= 200 or not raw.endswith(b"/"):
            raise GputraceError(f"device dir {prefix!r} must be an absolute path of <= 200 bytes")
        tbl = self.bpf["config"]
        leaf = tbl.Leaf()
        leaf.self_tgid = self_tgid
        leaf.filter = 1 if filter_targets else 0
        leaf.prefix_len = len(raw)
        leaf.comm_cache = 1 if self.comm_cache else 0
        leaf.prefix = raw
        tbl[ctypes.c_int(0)] = leaf

    def set_uvm_layouts(self, driver: DriverInfo) -> None:
        tbl = self.bpf["uvm_layouts"]
        names = [f[0] for f in decode.UVM_LAYOUT_DTYPE.descr]
        for lay in driver.layouts:
            leaf = tbl.Leaf()
            for name, value in zip(names, lay.as_tuple(), strict=True):
                setattr(leaf, name, value)
            tbl[ctypes.c_int(slot(lay.cmd))] = leaf

    def add_targets(self, pids: Iterable[int]) -> None:
        tbl = self.bpf["targets"]
        for pid in pids:
            tbl[ctypes.c_uint(pid)] = ctypes.c_ubyte(1)

    def mark_known(self, tgids: Iterable[int]) -> None:
        """Let these processes past the probes' first filter (`known_tgids`)."""
        tbl = self.bpf["known_tgids"]
        for tgid in tgids:
            try:
                leaf = tbl[ctypes.c_int(tgid >> 6)]
            except (KeyError, IndexError):
                continue  # beyond the array: the probes already treat it as known
            leaf.b[tgid & 63] = 1
            tbl[ctypes.c_int(tgid >> 6)] = leaf

    def seed_fds(self, fds: dict[tuple[int, int], tuple[int, int]]) -> None:
        tbl, seen = self.bpf["fds"], self.bpf["seen"]
        self.mark_known({pid for pid, _fd in fds})
        for (pid, fd), (kind, gpu) in fds.items():
            leaf = tbl.Leaf()
            leaf.kind = kind
            leaf.gpu = gpu
            tbl[ctypes.c_ulonglong((pid << 32) | fd)] = leaf
            seen[ctypes.c_uint(pid)] = ctypes.c_ubyte(1)

    def forget_tgids(self, tgids: set[int]) -> None:
        """Drop fd entries of exited processes (beyond the fds BPF scans itself)."""
        if not tgids:
            return
        tbl = self.bpf["fds"]
        stale = [k for k in tbl if (k.value >> 32) in tgids]
        for k in stale:
            with contextlib.suppress(KeyError):
                del tbl[k]

    # -- data
    def consume(self) -> None:
        self.rings.consume()

    def flush_staging(self) -> None:
        """Make each CPU's probe submit its partial batch (our own trigger ioctl)."""
        cpus = sorted(os.sched_getaffinity(0))
        try:
            for cpu in cpus:
                os.sched_setaffinity(0, {cpu})
                self._libc.ioctl(-1, ctypes.c_ulong(FLUSH_CMD), 0)
        finally:
            os.sched_setaffinity(0, set(cpus))

    def leftover_staging(self) -> bytes:
        """Partial batches still staged (CPUs we may not run on); call after stop."""
        out = []
        for per_cpu in self.bpf["ioctl_staging"][ctypes.c_int(0)]:
            raw = bytes(per_cpu)
            count = int.from_bytes(raw[:4], "little")
            if count:
                out.append(raw[: decode.BATCH_HEADER + count * decode.IOCTL_DTYPE.itemsize])
        return b"".join(out)

    # -- CPU faults on managed memory
    def leftover_fault_staging(self) -> bytes:
        """Partial fault batches still staged (CPUs we may not run on); call after stop."""
        out = []
        size = decode_faults.FAULT_DTYPE.itemsize
        for per_cpu in self.bpf["fault_staging"][ctypes.c_int(0)]:
            raw = bytes(per_cpu)
            count = int.from_bytes(raw[:4], "little")
            if count:
                out.append(raw[: decode.BATCH_HEADER + count * size])
        return b"".join(out)

    def fault_stats(self) -> dict[str, int]:
        """Managed 2 MiB blocks and processes the BPF maps could not track."""
        tbl = self.bpf["fault_stats"]
        names = FAULT_STATS
        return {n: int(sum(tbl[ctypes.c_int(i)])) for i, n in enumerate(names)}

    def seed_managed(
        self, ranges: dict[int, tuple[dict[int, list[int]], list[tuple[int, int]]]]
    ) -> None:
        """Managed ranges mapped before recording (cpufaults.seed): per tgid, page
        bitmaps per 2 MiB block of the small ranges and [(start, end)] of the big ones."""
        procs, tbl = self.bpf["managed_procs"], self.bpf["managed_blocks"]
        self.mark_known(ranges)
        for i, (tgid, (per_block, big)) in enumerate(sorted(ranges.items())):
            try:  # the probe saw an mmap since attaching: add to its generation
                mp = procs[ctypes.c_uint(tgid)]
            except KeyError:
                mp = procs.Leaf()
                mp.gen = 0x80000000 | i  # bit 31: never a generation the probe hands out
            gen = int(mp.gen)
            mp.nblocks += len(per_block)  # nonzero: munmap must clear blocks
            free = [s for s in range(decode_faults.BIG_RANGES) if mp.big_end[s] == 0]
            for s, (lo, hi) in zip(free, big, strict=False):
                mp.big_start[s], mp.big_end[s] = lo, hi
            procs[ctypes.c_uint(tgid)] = mp
            for block, words in per_block.items():
                key, leaf = tbl.Key(), tbl.Leaf()
                key.tgid, key.gen, key.block = tgid, gen, block
                for w, v in enumerate(words):
                    leaf.bits[w] = v
                tbl[key] = leaf

    def forget_managed(self) -> int:
        """Delete blocks of retired generations (exec, exit); returns how many."""
        procs, tbl = self.bpf["managed_procs"], self.bpf["managed_blocks"]
        live = {(k.value, v.gen) for k, v in procs.items()}
        stale = [k for k in tbl if (k.tgid, k.gen) not in live]
        for k in stale:
            with contextlib.suppress(KeyError):
                del tbl[k]
        return len(stale)

    def drops(self) -> dict[str, int]:
        tbl = self.bpf["drops"]
        return {
            name: int(sum(tbl[ctypes.c_int(i)])) for i, name in enumerate(BUFFERS)
        }

    def take(self, name: str) -> bytes:
        chunks = self.raw[name]
        data = b"".join(chunks)
        chunks.clear()
        return data

    def close(self) -> None:
        self._close_fds()
        self.rings.close()
        detach_parallel(self.bpf)  # bcc's cleanup closes them one grace period at a time
        self.bpf.cleanup()
