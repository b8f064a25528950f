"""The one table of hook points of the syscall layer.

Each hook is a tracepoint. A required hook that the kernel lacks stops
`record` with an error naming it; an optional one is compiled out (its
`GT_HAVE_*` define is not set) and listed as skipped in the manifest.
"""

from __future__ import annotations

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
    Hook("syscalls", "sys_enter_close", True, "forget closed fds"),
    *_pair("dup", False, "follow duplicated fds"),
    *_pair("dup2", False, "follow duplicated fds"),
    *_pair("dup3", False, "follow duplicated fds"),
    *_pair("fcntl", False, "follow fds duplicated with F_DUPFD(_CLOEXEC)"),
    *_pair("mmap", True, "mappings of NVIDIA fds (managed ranges, RM mappings)"),
    *_pair("munmap", True, "unmapping of those ranges"),
    Hook("syscalls", "sys_enter_exit_group", False, "exit codes for the processes table"),
    Hook("sched", "sched_process_fork", True, "follow children of traced processes"),
    Hook("sched", "sched_process_exec", False, "exec of traced processes"),
    Hook("sched", "sched_process_exit", True, "process exits"),
)


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
        elif h.define in missing_optional:
            skipped.append({"name": h.name, "reason": "tracepoint not in this kernel"})
        else:
            attach.append(h)
            assert h.define is not None
            defines.add(h.define)
    return attach, skipped, sorted(defines)
