"""What /proc tells the recorder: NVIDIA fds already open (to seed the BPF fd
map), and the facts of the processes table (ppid, comm, exe, cmdline, cgroup,
container id)."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")

DEV_CTL, DEV_GPU, DEV_UVM, DEV_UVM_TOOLS = 1, 2, 3, 4
_GPU_RE = re.compile(r"^nvidia(\d{1,3})$")
_CONTAINER_RE = re.compile(r"(?:^|[/-])([0-9a-f]{64})(?:\.scope)?$")


def device_kind(name: str) -> tuple[int, int] | None:
    """(kind, gpu index or -1) for a device file name, e.g. 'nvidia0' -> (2, 0)."""
    if name == "nvidiactl":
        return DEV_CTL, -1
    if name == "nvidia-uvm":
        return DEV_UVM, -1
    if name == "nvidia-uvm-tools":
        return DEV_UVM_TOOLS, -1
    m = _GPU_RE.match(name)
    if m:
        return DEV_GPU, int(m.group(1))
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
    container_id: str | None = None
    start_ts_ns: int | None = None
    exit_ts_ns: int | None = None
    exit_code: int | None = None


def read_info(pid: int, info: ProcInfo | None = None) -> ProcInfo:
    """Fill what /proc still says about `pid` (best effort: it may be gone)."""
    info = info or ProcInfo(pid)
    base = PROC / str(pid)
    st = _stat(pid)
    if st is not None:
        info.comm = st[0]
        info.ppid = info.ppid if info.ppid is not None else st[1]
    with contextlib.suppress(OSError):
        info.exe = os.readlink(base / "exe")
    try:
        raw = (base / "cmdline").read_bytes()
        if raw:
            info.cmdline = " ".join(
                a.decode("utf-8", "replace") for a in raw.rstrip(b"\0").split(b"\0")
            )
    except OSError:
        pass
    try:
        cg = (base / "cgroup").read_text()
        info.cgroup = cgroup_path(cg)
        info.container_id = container_id(info.cgroup)
    except OSError:
        pass
    return info


def cgroup_path(text: str) -> str | None:
    """The cgroup v2 path from /proc/PID/cgroup ('0::/path'), else the first entry's."""
    lines = [ln for ln in text.splitlines() if ln]
    for ln in lines:
        if ln.startswith("0::"):
            return ln[3:]
    return lines[0].split(":", 2)[-1] if lines else None


def container_id(cgroup: str | None) -> str | None:
    """A 64-hex container id from a docker/containerd/cri-o/podman cgroup path."""
    if not cgroup:
        return None
    for part in reversed(cgroup.split("/")):
        m = _CONTAINER_RE.search(part)
        if m:
            return m.group(1)
    return None
