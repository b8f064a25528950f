"""The thread that lets a process go as soon as its new Python stack is read.

A call whose Python stack the probe stores for the first time stops its process
(GT_PAUSE_PY, probes/cuda.bpf.c): the code objects that stack names must be read
while the process lives, and a program may exit, crash or be killed right after
that call. The drain would read them at its next turn (up to the poll interval,
50 ms, later); this thread sleeps in epoll on the `cuda_py_wake` ring buffer
alone (a ring buffer manager of its own, as record/oom_watch.py), reads the code
objects of each stack named there, and continues the process at once. A process
stopped for anything else as well (its libcuda load, its first call) is left to
the drain, which serves those too.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from typing import Any

from gputrace.record import loader

POLL_MS = 100  # the stop flag's latency; records wake the thread at once


class PyPauseWatch:
    """Own ring buffer manager and thread on `cuda_py_wake` of the loaded API
    program `api` (a record.api.libcuda.LibcudaProbes), serving under its
    `pause_lock` the stops whose only kind is `pause_py` (GT_PAUSE_PY)."""

    def __init__(self, api: Any, pause_py: int) -> None:
        libbcc = loader.import_bcc().libbcc
        self._lib = libbcc.lib
        self.api, self.pause_py = api, pause_py
        self._got: list[int] = []
        self.records = 0
        self._cb = libbcc._RINGBUF_CB_TYPE(self._on_record)  # alive while the manager is
        self._rb = self._lib.bpf_new_ringbuf(api.bpf["cuda_py_wake"].map_fd, self._cb, None)
        if not self._rb:
            raise OSError("cannot open the cuda_py_wake ring buffer")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gputrace-py-pauses",
                                        daemon=True)  # fmt: skip
        self._thread.start()

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

    def _on_record(self, _ctx: Any, data: int, size: int) -> int:
        if size >= 8:
            self._got.append(int.from_bytes(ctypes.string_at(data, 8), "little"))
        return 0

    def _run(self) -> None:
        while not self._stop.is_set():
            self._lib.bpf_poll_ringbuf(self._rb, POLL_MS)
            if not self._got:
                continue
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

    def close(self) -> None:
        """Stop the thread, then free the manager (never while it polls)."""
        self._stop.set()
        self._thread.join()
        if self._rb:
            self._lib.bpf_free_ringbuf(self._rb)
            self._rb = None
