"""The recorder's helper processes (the fd helper, the unwind-table compile worker)
end with the recording, whatever state the kernel left them in: each is killed
(SIGKILL) and reaped. One the kernel will not let go within REAP_WAIT_S (asleep
uninterruptibly, e.g. in a FLUSH that a traced process's FUSE filesystem never
answers: SIGKILL waits for it) is said at once on stderr and kept in `LEFT` for the
trace's manifest (`helpers_left`), so that a stuck root process never goes unsaid."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

REAP_WAIT_S = 0.5
"""How long a killed helper is waited for: a process that SIGKILL can end is gone
in milliseconds; one still there is held by the kernel and is not waited for."""
STATES = {"D": "asleep uninterruptibly", "T": "stopped", "t": "stopped by a tracer",
          "R": "running", "S": "asleep", "Z": "ended, not reaped"}
LEFT: list[dict[str, Any]] = []
_LOCK = threading.Lock()
_EVER = [0]  # helpers left to the kernel in this process's life


def state(pid: int) -> str | None:
    """The one-letter state of /proc/PID/stat; None when the process is gone."""
    return state_of(f"/proc/{pid}/stat")


def state_of(path: str) -> str | None:
    try:
        raw = Path(path).read_bytes()
    except OSError:
        return None
    return raw[raw.rfind(b")") + 2 :].split()[0].decode("ascii", "replace")


def held_state(pid: int) -> str | None:
    """The state that holds `pid`: D when any of its threads is asleep uninterruptibly
    (a killed process whose main thread is a zombie waits for it), else its own."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return state(pid)
    if any(state_of(f"/proc/{pid}/task/{t}/stat") == "D" for t in tasks):
        return "D"
    return state(pid)


def end(what: str, pid: int, kill: Callable[[], None],
        reaped: Callable[[float], bool]) -> bool:
    """Kill the helper `what` (process `pid`) and wait up to REAP_WAIT_S for
    `reaped(timeout)`; False (said on stderr and kept in LEFT) when it is still there."""
    with contextlib.suppress(OSError, ValueError):
        kill()
    if reaped(REAP_WAIT_S):
        return True
    st = held_state(pid)
    if st is None:  # reaped by another waiter (the pool's own thread): gone
        return True
    note = {"helper": what, "pid": pid, "state": st,
            "why": f"{STATES.get(st, 'state ' + st)} after SIGKILL and {REAP_WAIT_S:g} s"}
    with _LOCK:
        LEFT.append(note)
        _EVER[0] += 1
    print(f"gputrace: warning: the {what} (pid {pid}) could not be ended: {note['why']}; "
          "it is left to the kernel (it holds no part of the trace)", file=sys.stderr,
          flush=True)
    return False


def take_left() -> list[dict[str, Any]]:
    """The helpers not ended since the last call (for the manifest)."""
    with _LOCK:
        out = list(LEFT)
        LEFT.clear()
    return out


def exit_if_left(rc: int) -> None:
    """Exit now with `rc` when a helper was left to the kernel: the interpreter's own
    exit would wait for it (the compile worker's process pool joins its worker at
    exit, forever for one asleep uninterruptibly, and the recorder never ended). Called
    once the trace is closed and everything said; nothing else of the exit is needed."""
    if not _EVER[0]:
        return
    with contextlib.suppress(Exception):
        # multiprocessing's own clean-up of the pool's semaphores (else its resource
        # tracker unlinks them and warns of a leak on our stderr)
        from multiprocessing import util

        getattr(util, "_run_finalizers", lambda _priority: None)(0)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(rc)
