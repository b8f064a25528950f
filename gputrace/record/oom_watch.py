"""The thread that hears "no memory" failures the moment the ioctl probe sees them.

The probe stages ioctl events and the recorder drains them every 50 ms; a failure
with NV_ERR_NO_MEMORY is also written alone to the `oom_events` ring buffer with a
wakeup (probes/nv_ioctl.bpf.h). This thread sleeps in epoll on that buffer alone,
through a ring buffer manager of its own (bcc's is shared by every buffer the poll
thread drains), and fires the session's incident signal for each record, so the RM
sampler queries the GPU within about a millisecond of the failed call's return.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from gputrace.record import incidents, loader

POLL_MS = 100  # the stop flag's latency; records wake the thread at once


class OomWatch:
    """Own ring buffer manager and thread on the `oom_events` map of a loaded program."""

    def __init__(self, bpf: Any, signal: incidents.IncidentSignal, table: str = "oom_events",
                 api_names: Mapping[int, str] | None = None) -> None:
        """`table`: the ring buffer map; `api_names` for the API layer's (function ids)."""
        libbcc = loader.import_bcc().libbcc  # loaded already: the program is
        self._lib = libbcc.lib
        self.signal = signal
        self.api_names = api_names
        self.records = 0
        self._cb = libbcc._RINGBUF_CB_TYPE(self._on_record)  # kept alive while the manager is
        fd = bpf[table].map_fd
        self._rb = self._lib.bpf_new_ringbuf(fd, self._cb, None)
        if not self._rb:
            raise OSError(f"cannot open the {table} ring buffer")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gputrace-oom", daemon=True)
        self._thread.start()

    def _on_record(self, _ctx: Any, data: int, size: int) -> int:
        if size >= incidents.OOM_DTYPE.itemsize:
            raw = ctypes.string_at(data, incidents.OOM_DTYPE.itemsize)
            rec = np.frombuffer(raw, incidents.OOM_DTYPE)[0]
            self.records += 1
            # a subscriber's error must not unwind into C; the decoded row delivers it
            with contextlib.suppress(Exception):
                self.signal.fire(incidents.from_probe(rec, self.api_names), early=True)
        return 0

    def _run(self) -> None:
        while not self._stop.is_set():
            self._lib.bpf_poll_ringbuf(self._rb, POLL_MS)

    def close(self) -> None:
        """Stop the thread, then free the manager (never while it polls)."""
        self._stop.set()
        self._thread.join()
        if self._rb:
            self._lib.bpf_free_ringbuf(self._rb)
            self._rb = None
