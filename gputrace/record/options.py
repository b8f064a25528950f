"""`gputrace record`'s options and the checks that refuse a recording before
anything is started."""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gputrace.errors import GputraceError, UsageError
from gputrace.record import driver_version as driver
from gputrace.record import hooks, loader
from gputrace.record.api import libcuda as cuda
from gputrace.record.freeze import Flight
from gputrace.record.rm_query import sampler as memory_sampler
from gputrace.record.uvm_tools import tracker as uvm_tools
from gputrace.trace.output import check_output

MAX_DURATION_S = 10 * 365 * 86400.0
"""-d at most ten years: past that a number is a typo, not a plan (and 1e300 s
would overflow the deadline arithmetic)."""

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
    sample_ms: float = memory_sampler.DEFAULT_SAMPLE_MS  # --sample-interval
    pid_sample_ms: float = memory_sampler.DEFAULT_PID_SAMPLE_MS  # --pid-memory-interval
    uvm_queue_version: int | None = None  # --uvm-queue-version (tests)
    stack_depth: int = cuda.STACK_DEPTH  # --stack-depth: frames per allocation stack
    raw: bool = False  # --raw: ioctl events written undecoded (rawparts.py)
    flight: Flight = field(default_factory=Flight)  # --keep, --freeze-on, --after
    kube_root: str = "/"  # --kube-root: the host root of /var/log/pods, runtime files
    torch_stacks: str = "python"  # --torch-stacks: none|python|full (torch_allocator layer)
    no_cache: bool = False  # --no-cache: no BPF object or unwind-table cache


SPILL_ENV = "GPUTRACE_SPILL_MIB"
SPILL_DEFAULT_MIB = 32


def spill_bytes() -> int:
    """When ioctl events are written raw, to be decoded when the recording ends: while
    they arrive at this many bytes a second or more, or the writer thread is this
    many bytes behind. `GPUTRACE_SPILL_MIB`, 0 to 65536 (0: always; default 32 MiB,
    ~200 k ioctls a second)."""
    text = os.environ.get(SPILL_ENV)
    if text is None:
        return SPILL_DEFAULT_MIB << 20
    # ASCII digits only: int() would also read "²" (an error) or "١٢" (as 12), and
    # refuses strings past 4300 digits
    if not re.fullmatch(r"[0-9]{1,6}", text) or int(text) > 65536:
        raise UsageError(f"{SPILL_ENV}={text!r}: a whole number of MiB from 0 to 65536")
    return int(text) << 20


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
