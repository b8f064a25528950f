"""The thread that lets a process go as soon as its new Python stack is read.

A call whose Python stack the probe stores for the first time stops its process
(GT_PAUSE_PY, cuda_stop_for in probes/cuda_python.bpf.h: the API layer's calls and
the torch_allocator layer's malloc): the code objects that stack names must be read
while the process lives, and a program may exit, crash or be killed right after
that call. This thread sleeps in epoll on the `cuda_py_wake` ring buffer alone
(record/ring_watch.py, as record/oom_watch.py), reads the code objects of each stack
named there, and continues the process at once. It is the only reader of those
stacks: the torch_allocator layer's malloc stops at its entry, before its event is
in any ring buffer the drain reads, so the drain leaves a fresh stop for a Python
stack alone to this thread (libcuda.py, PY_WATCH_S). A process stopped for anything
else as well (its libcuda load, its first call) has its stacks read here and is
continued by the drain, which serves those stops.
"""

from __future__ import annotations

import contextlib
import ctypes
from typing import Any

from gputrace.record.api import watchdog
from gputrace.record.ring_watch import RingWatch

STOP_WAIT_S = 1.0  # as libcuda.STOP_WAIT_S: the most a stop is waited for


class PyPauseWatch(RingWatch):
    """Own ring buffer reader and thread on `cuda_py_wake` of the loaded API
    program `api` (a record.api.libcuda.LibcudaProbes), serving under its
    `pause_lock` the stops whose only kind is `pause_py` (GT_PAUSE_PY)."""

    def __init__(self, api: Any, pause_py: int) -> None:
        self.api, self.pause_py = api, pause_py
        self._got: list[int] = []
        super().__init__(api.bpf, "cuda_py_wake", "gputrace-py-pauses")

    def serve(self, pid: int, py_ids: list[int]) -> None:
        """Read the code objects of `pid`'s new stacks, and continue it when a new
        Python stack is all it stopped for (else the drain continues it)."""
        api = self.api
        for py_id in py_ids:
            api.py.read_stack(pid, py_id)
        tbl = api.bpf["cuda_paused"]
        try:
            v = tbl[ctypes.c_uint(pid)]
        except KeyError:
            return  # the drain served it (the watch late past PY_WATCH_S)
        if not v.stopped or v.kinds & ~self.pause_py:
            return
        # Another thread may have stored a new stack of its own before the stop
        # reached it (one stop serves the whole process): once the process is
        # stopped, every such thread has named its stack here; read those too.
        watchdog.wait_stopped(pid, STOP_WAIT_S)
        if self._reader is not None:  # this thread's own reader (serve runs in it)
            self._reader.consume()
        late = [w & 0xFFFFFFFF for w in self._got if w >> 32 == pid]
        self._got = [w for w in self._got if w >> 32 != pid]
        self.records += len(late)
        for py_id in late:
            api.py.read_stack(pid, py_id)
        try:  # read again: a stop for something else may have joined meanwhile
            v = tbl[ctypes.c_uint(pid)]
        except KeyError:
            return
        if v.kinds & ~self.pause_py:
            return
        api.py_pauses += 1
        api.pauses += 1
        api._release(tbl, pid, v.stopped, v.stop_boot_ns)

    def _on_record(self, data: bytes) -> None:
        if len(data) >= 8:
            self._got.append(int.from_bytes(data[:8], "little"))

    def _after_poll(self) -> None:
        while self._got:  # serving a process may take in records of others
            got, self._got = self._got, []
            self.records += len(got)
            by_pid: dict[int, list[int]] = {}
            for word in got:
                by_pid.setdefault(word >> 32, []).append(word & 0xFFFFFFFF)
            with self.api.pause_lock:
                for pid, ids in by_pid.items():
                    # the drain serves it at its next turn whatever went wrong here
                    with contextlib.suppress(Exception):
                        self.serve(pid, ids)
