"""The one table of hook points of the syscall layer.

Each hook is a tracepoint. A required hook that the kernel lacks stops
`record` with an error naming it; an optional one is compiled out (its
`GT_HAVE_*` define is not set) and listed as skipped in the manifest.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path

from gputrace.errors import GputraceError

TRACEFS = Path("/sys/kernel/tracing")


@dataclass(frozen=True)
class Hook:
    category: str
    event: str
    required: bool
    why: str
    arch: str | None = None  # only on this platform.machine(); skipped elsewhere

    @property
    def name(self) -> str:
        return f"{self.category}:{self.event}"

    @property
    def define(self) -> str | None:
        """The -D that compiles an optional probe in (keyed by its enter event)."""
        if self.required:
            return None
        ev = self.event.replace("sys_exit_", "sys_enter_")
        return "GT_HAVE_" + ev.upper()


def _pair(name: str, required: bool, why: str) -> tuple[Hook, Hook]:
    return (
        Hook("syscalls", f"sys_enter_{name}", required, why),
        Hook("syscalls", f"sys_exit_{name}", required, why),
    )


HOOKS: tuple[Hook, ...] = (
    *_pair("ioctl", True, "RM and UVM commands on NVIDIA fds"),
    *_pair("openat", True, "which fds are NVIDIA devices"),
    *_pair("open", False, "which fds are NVIDIA devices (legacy open)"),
    *_pair("openat2", False, "which fds are NVIDIA devices (openat2)"),
    *_pair("close", True, "forget closed fds; close rows of the files table"),
    *_pair("dup", False, "follow duplicated fds"),
    *_pair("dup2", False, "follow duplicated fds"),
    *_pair("dup3", False, "follow duplicated fds"),
    *_pair("fcntl", False, "follow fds duplicated with F_DUPFD(_CLOEXEC)"),
    *_pair("mmap", True, "mappings of NVIDIA fds (managed ranges, RM mappings)"),
    *_pair("munmap", True, "unmapping of those ranges"),
    Hook("syscalls", "sys_enter_exit_group", False, "exit codes for the processes table"),
    Hook("sched", "sched_process_fork", True,
         "follow children of traced processes; how every process began (proc_starts)"),
    Hook("sched", "sched_process_exec", False,
         "exec of traced processes; exec time and cgroup of every process"),
    Hook("sched", "sched_process_exit", True, "process exits"),
    # its arguments (address, ip, error_code) are x86's; probes/nv_faults.bpf.h
    Hook("exceptions", "page_fault_user", False, "CPU page faults on managed memory",
         arch="x86_64"),
)
ARCH_NOTE = "x86-64 only (the tracepoint and its error_code bits are x86's)"


def notes() -> dict[str, str]:
    """Manifest notes on hooks that exist only on some machines."""
    return {h.name: ARCH_NOTE for h in HOOKS if h.arch == "x86_64"}


def ensure_tracefs() -> Path:
    """Mount tracefs at /sys/kernel/tracing when it is missing (needs root)."""
    if (TRACEFS / "events").is_dir():
        return TRACEFS
    debug = Path("/sys/kernel/debug/tracing")
    if (debug / "events").is_dir():
        return debug
    import subprocess

    r = subprocess.run(
        ["mount", "-t", "tracefs", "nodev", str(TRACEFS)], capture_output=True, text=True
    )
    if r.returncode != 0 or not (TRACEFS / "events").is_dir():
        err = (r.stderr or "").strip().splitlines()
        raise GputraceError(
            "tracefs is not mounted and mounting it failed"
            + (f" ({err[0]})" if err else "")
            + ": mount -t tracefs nodev /sys/kernel/tracing"
        )
    return TRACEFS


def available(tracefs: Path, hook: Hook) -> bool:
    return (tracefs / "events" / hook.category / hook.event / "format").is_file()


def plan(tracefs: Path) -> tuple[list[Hook], list[dict[str, str]], list[str]]:
    """(hooks to attach, skipped hooks with reasons, -D defines); raises for required."""
    attach: list[Hook] = []
    skipped: list[dict[str, str]] = []
    defines: set[str] = set()
    missing_optional = {h.define for h in HOOKS if not h.required and not available(tracefs, h)}
    for h in HOOKS:
        if h.required:
            if not available(tracefs, h):
                raise GputraceError(
                    f"required tracepoint {h.name} is missing from this kernel ({h.why})"
                )
            attach.append(h)
        elif h.arch is not None and platform.machine() != h.arch:
            skipped.append({"name": h.name, "reason": ARCH_NOTE})
        elif h.define in missing_optional:
            skipped.append({"name": h.name, "reason": "tracepoint not in this kernel"})
        else:
            attach.append(h)
            assert h.define is not None
            defines.add(h.define)
    return attach, skipped, sorted(defines)


# ---------------------------------------------------------------- API layer
# libcuda functions probed with a uprobe + uretprobe (probes/cuda.bpf.c: one
# `uprobe_<symbol>` program per entry, `uretprobe_cuda` for every return). The
# id of `sym` is `base`; `sym_ptsz` is base + 1, `sym_ptds` base + 2 (attached
# only where the library exports them; missing symbols are listed as skipped).
CUDA_VARIANTS: tuple[str, ...] = ("", "_ptsz", "_ptds")


@dataclass(frozen=True)
class CudaFunc:
    symbol: str
    base: int
    shape: str  # S_* argument shape in probes/cuda.bpf.c
    allocates: bool  # returns a pointer/handle through an out-parameter (stack taken)


CUDA_FUNCS: tuple[CudaFunc, ...] = (
    CudaFunc("cuMemAlloc_v2", 0, "S_OUT_SIZE", True),
    CudaFunc("cuMemAllocPitch_v2", 4, "S_PITCH", True),
    CudaFunc("cuMemFree_v2", 8, "S_FREE", False),
    CudaFunc("cuMemAllocManaged", 12, "S_OUT_SIZE_FLAGS", True),
    CudaFunc("cuMemAllocHost_v2", 16, "S_OUT_SIZE", True),
    CudaFunc("cuMemHostAlloc", 20, "S_OUT_SIZE_FLAGS", True),
    CudaFunc("cuMemFreeHost", 24, "S_FREE", False),
    CudaFunc("cuMemCreate", 28, "S_CREATE", True),
    CudaFunc("cuMemRelease", 32, "S_RELEASE", False),
    CudaFunc("cuMemMap", 36, "S_MAP", False),
    CudaFunc("cuMemUnmap", 40, "S_PTR_SIZE", False),
    CudaFunc("cuMemAddressReserve", 44, "S_RESERVE", True),
    CudaFunc("cuMemAddressFree", 48, "S_PTR_SIZE", False),
    CudaFunc("cuMemAllocAsync", 52, "S_ASYNC", True),
    CudaFunc("cuMemAllocFromPoolAsync", 56, "S_POOL_ASYNC", True),
    CudaFunc("cuMemFreeAsync", 60, "S_FREE_ASYNC", False),
)


def cuda_symbols() -> dict[str, int]:
    """Every symbol that may be probed (variants included) -> its function id."""
    return {
        f.symbol + v: f.base + i for f in CUDA_FUNCS for i, v in enumerate(CUDA_VARIANTS)
    }
