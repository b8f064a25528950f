"""What /proc tells the recorder: NVIDIA fds already open (to seed the BPF fd
map), and the facts of the processes table (ppid, comm, exe, cmdline, cgroup, and
the container and pod identity gputrace/identity.py derives from the cgroup), read
only when /proc/PID is still the process they are for."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gputrace import identity, schema
from gputrace.identity import Identity, NodeNames

PROC = Path("/proc")
CGROUP2 = Path("/sys/fs/cgroup")
TICK_NS = 10**9 // os.sysconf("SC_CLK_TCK")

_GPU_RE = re.compile(r"^nvidia(\d{1,3})$")


def device_kind(name: str) -> tuple[int, int] | None:
    """(kind, gpu index or -1) for a device file name, e.g. 'nvidia0' -> (2, 0)."""
    if name == "nvidiactl":
        return schema.DEV_CTL, -1
    if name == "nvidia-uvm":
        return schema.DEV_UVM, -1
    if name == "nvidia-uvm-tools":
        return schema.DEV_UVM_TOOLS, -1
    m = _GPU_RE.match(name)
    if m:
        return schema.DEV_GPU, int(m.group(1))
    return None


def classify(path: str, prefix: str) -> tuple[int, int] | None:
    """Kind of an absolute path under the device dir `prefix` (ends with '/')."""
    if not path.startswith(prefix):
        return None
    rest = path[len(prefix) :]
    if "/" in rest:
        return None
    return device_kind(rest)


def all_pids() -> list[int]:
    return sorted(int(p.name) for p in PROC.iterdir() if p.name.isdigit())


def open_devices(pid: int, prefix: str) -> Iterator[tuple[int, int, int]]:
    """(fd, kind, gpu) for each NVIDIA device `pid` has open now."""
    fd_dir = PROC / str(pid) / "fd"
    try:
        entries = os.listdir(fd_dir)
    except OSError:
        return
    for name in entries:
        try:
            target = os.readlink(fd_dir / name)
        except OSError:
            continue
        k = classify(target, prefix)
        if k is not None:
            yield int(name), k[0], k[1]


def seed(pids: Iterable[int], prefix: str) -> dict[tuple[int, int], tuple[int, int]]:
    """{(tgid, fd): (kind, gpu)} for the given processes."""
    out: dict[tuple[int, int], tuple[int, int]] = {}
    for pid in pids:
        for fd, kind, gpu in open_devices(pid, prefix):
            out[(pid, fd)] = (kind, gpu)
    return out


def children(pid: int) -> list[int]:
    """Descendants of `pid` (from /proc/*/stat ppid), not including it."""
    parents: dict[int, int] = {}
    for p in all_pids():
        info = _stat(p)
        if info is not None:
            parents[p] = info[1]
    out, frontier = [], [pid]
    while frontier:
        cur = frontier.pop()
        kids = [c for c, pp in parents.items() if pp == cur]
        out += kids
        frontier += kids
    return out


def _stat(pid: int) -> tuple[str, int] | None:
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    lp, rp = text.find("("), text.rfind(")")
    fields = text[rp + 2 :].split()
    return text[lp + 1 : rp], int(fields[1])


def is_alive(pid: int) -> bool:
    return (PROC / str(pid)).is_dir()


@dataclass
class ProcInfo:
    pid: int
    ppid: int | None = None
    comm: str | None = None
    exe: str | None = None
    cmdline: str | None = None
    cgroup: str | None = None
    identity: Identity = identity.NONE  # the processes table's IDENTITY_COLUMNS
    start_ts_ns: int | None = None
    exit_ts_ns: int | None = None
    exit_code: int | None = None
    zombie_threads: int | None = None  # read at the exit: zombie_threads_of


@dataclass(frozen=True)
class ProcFact:
    """A fact of the processes table read from /proc/PID when a process first matters:
    the `ProcInfo` field it fills (the processes column of that name; `identity`: the
    IDENTITY_COLUMNS), the file under /proc/PID it comes from and how that file is read
    (`parse`: raises OSError when the file is gone; None: nothing to say). `comm`, `ppid`
    and the start time come from `stat` apart: other sources take precedence over them."""

    field: str
    file: str
    parse: Callable[[Path], Any]
    how: str


def _cmdline(path: Path) -> str | None:
    raw = path.read_bytes()
    if not raw:
        return None  # a kernel thread, or a process past its exit: no arguments to tell
    return " ".join(a.decode("utf-8", "replace") for a in raw.rstrip(b"\0").split(b"\0"))


PROC_FACTS: tuple[ProcFact, ...] = (
    ProcFact("exe", "exe", os.readlink, "the link's target"),
    ProcFact("cmdline", "cmdline", _cmdline,
             "the arguments, NUL-separated, joined by spaces (invalid UTF-8 replaced)"),
    ProcFact("cgroup", "cgroup", lambda p: cgroup_path(p.read_text()),
             "the cgroup v2 path (`0::/path`), else the v1 memory controller's"),
    ProcFact("identity", "cgroup", lambda p: identity.from_proc_cgroup(p.read_text()),
             "container and pod from the cgroup path's layout (gputrace/identity.py; their "
             "names from the node's files, docs/containers.md)"),
)
"""Every fact read from /proc/PID: `read_info` reads them, `copy_facts` copies them and
docs/record.md lists them (`facts_table`, a generated block), all from this list."""


def copy_facts(dst: ProcInfo, src: ProcInfo) -> None:
    """`dst` gets the /proc facts of `src` (read for the same process, later)."""
    for f in PROC_FACTS:
        setattr(dst, f.field, getattr(src, f.field))


def facts_table() -> str:
    """The /proc facts as docs/record.md lists them."""
    out = ["| processes column(s) | from /proc/PID/ | read as |", "|---|---|---|"]
    for f in PROC_FACTS:
        cols = ([c.name for c in schema.IDENTITY_COLUMNS] if f.field == "identity"
                else [f.field])
        out.append(f"| {', '.join(f'`{c}`' for c in cols)} | `{f.file}` | {f.how} |")
    out.append("| `comm`, `ppid` (and the start time, to check the pid is still the "
               "process) | `stat` | the name between the outer parentheses; field 4; "
               "field 22 in clock ticks |")
    return "\n".join(out) + "\n"


def start_boot_ns(pid: int) -> int | None:
    """When /proc/PID's process started, CLOCK_BOOTTIME ns (whole clock ticks,
    rounded down), or None when there is no such process."""
    try:
        text = (PROC / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    fields = text[text.rfind(b")") + 2 :].split()
    try:  # fields[0] is field 3 (state); starttime is field 22
        return int(fields[19]) * TICK_NS - boot_offset_ns()
    except (IndexError, ValueError):
        return None


def tgid(pid: int) -> int | None:
    """The thread group of task `pid` (itself for a process, its process for a
    thread), or None when there is no such task."""
    try:
        with open(PROC / str(pid) / "status", "rb") as f:
            for line in f:
                if line.startswith(b"Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def zombie_threads_of(pid: int) -> int | None:
    """At its main thread's exit: how many threads of `pid` still run (more than 0 when
    the main thread exited alone, pthread_exit: a zombie whose threads keep its files);
    None when the process is gone or unreadable."""
    state, threads = None, None
    try:
        with open(PROC / str(pid) / "status", "rb") as f:
            for line in f:
                if line.startswith(b"State:"):
                    state = line.split()[1]
                elif line.startswith(b"Threads:"):
                    threads = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    if state is None or threads is None:
        return None
    return threads - 1 if state == b"Z" else 0


def boot_offset_ns() -> int:
    """This time namespace's CLOCK_BOOTTIME offset (/proc/PID/stat includes it)."""
    try:
        with open("/proc/self/timens_offsets") as f:
            for line in f:
                name, sec, nsec = line.split()
                if name == "boottime":
                    return int(sec) * 10**9 + int(nsec)
    except (OSError, ValueError):
        pass
    return 0


def read_checked(pid: int, info: ProcInfo, *, fork_boot_ns: int | None,
                 alive_boot_ns: int, node: NodeNames | None = None) -> bool:
    """Fill `info` from /proc/PID only when that is the process `info` is about;
    True when it was. With its fork known (`fork_boot_ns`, CLOCK_BOOTTIME), the
    process must have started then (within a clock tick); else it must have
    started no later than `alive_boot_ns`, a moment it was known to hold the pid
    (two processes never hold one pid at once, so one that started before that
    moment and holds it now is the same). The start time is read before and after
    the other files, so a process that exited in between is not mistaken for one
    reusing its pid. `node`: where the container's and pod's names are read."""
    first = start_boot_ns(pid)
    if first is None:
        return False
    if fork_boot_ns is not None:
        if not fork_boot_ns - 2 * TICK_NS <= first <= fork_boot_ns:
            return False
    elif first > alive_boot_ns:
        return False
    got = read_info(pid, ProcInfo(pid), node)
    if start_boot_ns(pid) != first:
        return False
    info.comm = got.comm or info.comm
    info.ppid = info.ppid if info.ppid is not None else got.ppid
    copy_facts(info, got)
    return True


def cgroup_by_id(cgroup_id: int, root: Path = CGROUP2) -> str | None:
    """The cgroup v2 path whose id (its directory's inode number) is `cgroup_id`,
    relative to the cgroup2 mount, or None when no such cgroup exists now."""
    base = _cgroup2_mount(root)
    if base is None or cgroup_id <= 0:
        return None
    with contextlib.suppress(OSError):
        if os.stat(base).st_ino == cgroup_id:
            return "/"
    for top, dirs, _files in os.walk(base):
        for d in dirs:
            path = os.path.join(top, d)
            with contextlib.suppress(OSError):
                if os.stat(path, follow_symlinks=False).st_ino == cgroup_id:
                    return "/" + os.path.relpath(path, base)
    return None


def _cgroup2_mount(root: Path) -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (root itself, or root/unified on a
    hybrid host)."""
    try:
        with open("/proc/self/mounts") as f:
            mounts = [ln.split() for ln in f]
    except OSError:
        return None
    points = [m[1] for m in mounts if len(m) > 2 and m[2] == "cgroup2"]
    for want in (str(root), str(root / "unified")):
        if want in points:
            return Path(want)
    return Path(points[0]) if points else None


def read_info(pid: int, info: ProcInfo | None = None,
              node: NodeNames | None = None) -> ProcInfo:
    """Fill what /proc still says about `pid` (best effort: it may be gone); with
    `node`, the names the node tells of its container and pod."""
    info = info or ProcInfo(pid)
    base = PROC / str(pid)
    st = _stat(pid)
    if st is not None:
        info.comm = st[0]
        info.ppid = info.ppid if info.ppid is not None else st[1]
    for f in PROC_FACTS:
        with contextlib.suppress(OSError):
            value = f.parse(base / f.file)
            if value is not None:
                setattr(info, f.field, value)
    if node is not None:
        info.identity = node.named(info.identity)
    return info


def cgroup_path(text: str) -> str | None:
    """The `cgroup` column from /proc/PID/cgroup: the v2 path ('0::/path'), else (a
    v1-only host) the memory controller's, in the order identity.proc_cgroup_paths
    reads them (one parser of the file for both)."""
    paths = identity.proc_cgroup_paths(text)
    return paths[0] if paths else None

