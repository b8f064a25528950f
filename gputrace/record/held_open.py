"""Does a launched command's recording go on after the command exits?

Recording `-- CMD` covers the processes that hold CMD's NVIDIA device files: a child
forked after CMD opened them holds them too (and with them CMD's RM clients and
CUDA context) until it closes them or exits. So when CMD exits, the recording goes
on while any process the trace saw (CMD's descendants: the probes follow forks) is
alive and holds a device file; `-d` or Ctrl-C still stop it. The check reads
/proc/PID/fd of those few pids once per poll, only after CMD has exited.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from gputrace.record import procfs

PROC = "/proc"


def device_holders(pids: list[int], prefix: str) -> list[int]:
    """The processes of `pids` holding an open file whose path starts with `prefix`.
    A thread's tid is a fork to the probes too, and /proc/TID/fd shows its process's
    files: only a whole process (its own thread group) counts."""
    out = []
    for pid in pids:
        if procfs.tgid(pid) != pid:
            continue
        fd_dir = f"{PROC}/{pid}/fd"
        try:
            names = os.listdir(fd_dir)
        except OSError:  # gone, a zombie, or not ours to read
            continue
        for n in names:
            try:
                target = os.readlink(f"{fd_dir}/{n}")
            except OSError:
                continue
            if target.startswith(prefix):
                out.append(pid)
                break
    return out


def descendants(s: Any) -> set[int]:
    """CMD's descendants the trace saw (not CMD): each pid's parent as its fork said
    (the process facts, the fork events, the facts the poll thread read of forks the
    writer has not taken). Only these keep the recording going: a process that held
    the device files before the recording (`-- CMD` records the host's GPU users
    too) is none of CMD's."""
    with s._lock:
        early = {pid: info.ppid for (pid, _ts), info in s.early.items()}
    parent = {**early, **{pid: ts_ppid[1] for pid, ts_ppid in list(s.forks.items())},
              **{pid: info.ppid for pid, info in list(s.procs.items())}}
    tree = {s.child.pid}
    grew = True
    while grew:  # at most one pass per generation
        new = {pid for pid, pp in parent.items() if pp in tree and pid not in tree}
        tree |= new
        grew = bool(new)
    return tree - {s.child.pid}


class HeldOpen:
    """Whether processes of a recorded command still hold its device files; says so
    on stderr once, when the command itself has exited and they go on."""

    def __init__(self) -> None:
        self.told = False
        self.polls = 0

    GRACE_POLLS = 2
    """Polls after CMD's exit before its processes are looked for: a fork just before
    the exit may still be in the ring buffer the previous drain emptied."""

    def holding(self, s: Any) -> bool:
        """True while a traced process other than the exited CMD holds a device file."""
        self.polls += 1
        if self.polls <= self.GRACE_POLLS:
            return True
        left = device_holders(sorted(descendants(s)), s.prefix + "nvidia")
        if left and not self.told:
            self.told = True
            shown = ", ".join(str(p) for p in left[:10]) + (" ..." if len(left) > 10 else "")
            print(f"gputrace: the command exited; recording goes on while {len(left)} of "
                  f"its processes hold its GPU device files (pids {shown}); -d or Ctrl-C "
                  "stops it", file=sys.stderr, flush=True)
        return bool(left)
