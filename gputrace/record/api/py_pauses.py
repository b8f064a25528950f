"""The thread that lets a process go as soon as its new Python stack is read.

A call whose Python stack the probe stores for the first time stops its process
(GT_PAUSE_PY, probes/cuda.bpf.c): the code objects that stack names must be read
while the process lives, and a program may exit, crash or be killed right after
that call. The drain would read them at its next turn (up to the poll interval,
50 ms, later); this thread sleeps in epoll on the `cuda_py_wake` ring buffer
alone (record/ring_watch.py, as record/oom_watch.py), reads the code
objects of each stack named there, and continues the process at once. A process
stopped for anything else as well (its libcuda load, its first call) is left to
the drain, which serves those too.
"""

from __future__ import annotations

import contextlib
import ctypes
from typing import Any

from gputrace.record.ring_watch import RingWatch


class PyPauseWatch(RingWatch):
    """Own ring buffer reader and thread on `cuda_py_wake` of the loaded API
    program `api` (a record.api.libcuda.LibcudaProbes), serving under its
    `pause_lock` the stops whose only kind is `pause_py` (GT_PAUSE_PY)."""

    def __init__(self, api: Any, pause_py: int) -> None:
        self.api, self.pause_py = api, pause_py
        self._got: list[int] = []
        super().__init__(api.bpf, "cuda_py_wake", "gputrace-py-pauses")

    def serve(self, pid: int, py_ids: list[int]) -> None:
        """Read the code objects of `pid`'s new stacks and continue it, when a new
        Python stack is all it stopped for (else the drain serves it)."""
        api = self.api
        tbl = api.bpf["cuda_paused"]
        try:
            v = tbl[ctypes.c_uint(pid)]
        except KeyError:
            return  # the drain served it already
        if not v.stopped or v.kinds & ~self.pause_py:
            return
        for py_id in py_ids:
            api.py.read_stack(pid, py_id)
        api.py_pauses += 1
        api.pauses += 1
        api._release(tbl, pid, v.stopped, v.stop_boot_ns)

    def _on_record(self, data: bytes) -> None:
        if len(data) >= 8:
            self._got.append(int.from_bytes(data[:8], "little"))

    def _after_poll(self) -> None:
        if self._got:
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
