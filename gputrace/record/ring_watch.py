"""A ring buffer heard the moment a record lands, apart from the drain.

bcc's ring buffer manager is shared by every buffer the poll thread drains every
50 ms; a buffer whose records must be acted on at once (an out-of-memory failure,
a process stopped for its new Python stack) gets a manager and a thread of its own
that sleep in epoll on it alone. record/oom_watch.py and record/api/py_pauses.py.
"""

from __future__ import annotations

import threading
from typing import Any

from gputrace.record import loader

POLL_MS = 100  # the stop flag's latency; records wake the thread at once


class RingWatch:
    """Own ring buffer manager and thread on the map `table` of the loaded program
    `bpf`. A subclass sets what its handlers use before calling this constructor (the
    thread starts in it), handles each record in `_on_record` (called from C: it must
    not raise) and may act after each poll in `_after_poll`."""

    def __init__(self, bpf: Any, table: str, thread_name: str) -> None:
        libbcc = loader.import_bcc().libbcc  # loaded already: the program is
        self._lib = libbcc.lib
        self.records = 0
        self._cb = libbcc._RINGBUF_CB_TYPE(self._on_record)  # alive while the manager is
        self._rb = self._lib.bpf_new_ringbuf(bpf[table].map_fd, self._cb, None)
        if not self._rb:
            raise OSError(f"cannot open the {table} ring buffer")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)
        self._thread.start()

    def _on_record(self, _ctx: Any, data: int, size: int) -> int:
        raise NotImplementedError

    def _after_poll(self) -> None:
        """What the thread does after each poll (records handled, or the timeout)."""

    def _run(self) -> None:
        while not self._stop.is_set():
            self._lib.bpf_poll_ringbuf(self._rb, POLL_MS)
            self._after_poll()

    def close(self) -> None:
        """Stop the thread, then free the manager (never while it polls)."""
        self._stop.set()
        self._thread.join()
        if self._rb:
            self._lib.bpf_free_ringbuf(self._rb)
            self._rb = None
