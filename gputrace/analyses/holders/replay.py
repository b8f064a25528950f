"""Which processes held an NVIDIA device file at an instant, and who opened it?

The `files` table says when a process opened, duplicated or closed a device fd (and
which were already open when the recording began: `seen`); the `processes` table
says when each process was forked, by whom (`ppid`), and when it exited. A child
forked while its parent held device fds holds them too (fork copies the descriptor
table; the open file description, and so the RM clients behind it, stays alive
until its last holder lets go). Replaying both in time order gives, at each asked
instant, every live process holding device fds and, for each, the process that
opened them (`origin`: itself, or the ancestor whose open it inherited).

What the replay cannot see: an `exec` of a child closes the fds opened with
O_CLOEXEC (the trace has no exec row: such a child is taken as still holding them
until it closes them or exits), and fds passed over a Unix socket.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from gputrace.analyses.helpers.fds import CLOSE, DUP, OPEN, SEEN

_FORK, _FILE, _EXIT, _ASK = 0, 1, 2, 3
"""Order of events at one nanosecond: a fork before the child's own rows, an exit
after the process's last rows, a question after everything of its instant."""


@dataclass
class Holder:
    """One live process holding device fds at an instant."""

    pid: int
    fds: int
    origins: dict[int, int] = field(default_factory=dict)
    """Opener pid -> fds of its opening this process holds."""


def replay(files: pl.DataFrame, procs: pl.DataFrame,
           instants: list[int]) -> list[list[Holder]]:
    """Holders at each of `instants` (ns), from `files` (ts_ns, pid, fd_op_code, fd,
    new_fd, ret) and `procs` (pid, ppid, start_ts_ns, exit_ts_ns)."""
    events: list[tuple[int, int, int, int, int, int]] = []
    ok = files.filter(pl.col("ret").is_null() | (pl.col("ret") >= 0))
    for ts, pid, op, fd, new in zip(ok["ts_ns"], ok["pid"], ok["fd_op_code"], ok["fd"],
                                    ok["new_fd"], strict=True):
        events.append((int(ts), _FILE, int(pid), int(op), int(fd), -1 if new is None else int(new)))
    for pid, ppid, start, end in zip(procs["pid"], procs["ppid"], procs["start_ts_ns"],
                                     procs["exit_ts_ns"], strict=True):
        if start is not None and ppid is not None:
            events.append((int(start), _FORK, int(pid), int(ppid), 0, 0))
        if end is not None:
            events.append((int(end), _EXIT, int(pid), 0, 0, 0))
    events += [(int(t), _ASK, i, 0, 0, 0) for i, t in enumerate(instants)]
    events.sort()
    fds: dict[int, dict[int, int]] = {}  # pid -> fd -> origin pid
    out: list[list[Holder]] = [[] for _ in instants]
    for _ts, kind, pid, a, fd, new in events:
        if kind == _FORK:
            parent = fds.get(a)
            if parent:
                fds[pid] = dict(parent)
        elif kind == _EXIT:
            fds.pop(pid, None)
        elif kind == _ASK:
            out[pid] = _snapshot(fds)
        elif a in (OPEN, SEEN):
            fds.setdefault(pid, {})[fd] = pid
        elif a == DUP and new >= 0:
            mine = fds.setdefault(pid, {})
            mine[new] = mine.get(fd, pid)
        elif a == CLOSE:
            mine = fds.get(pid, {})
            mine.pop(fd, None)
            if not mine:
                fds.pop(pid, None)
    return out


def _snapshot(fds: dict[int, dict[int, int]]) -> list[Holder]:
    out = []
    for pid, mine in sorted(fds.items()):
        if not mine:
            continue
        origins: dict[int, int] = {}
        for origin in mine.values():
            origins[origin] = origins.get(origin, 0) + 1
        out.append(Holder(pid, len(mine), origins))
    return out
