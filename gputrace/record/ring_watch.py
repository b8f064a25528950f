"""A ring buffer heard the moment a record lands, apart from the drain.

The poll thread drains the layers' ring buffers every 50 ms; a buffer whose records
must be acted on at once (an out-of-memory failure, a process stopped for its new
Python stack) gets a reader and a thread of its own that sleep in epoll on it alone.
record/oom_watch.py and record/api/py_pauses.py.
"""

from __future__ import annotations

import threading
from typing import Any

from gputrace.record import ringbuf

POLL_MS = 100  # the stop flag's latency; records wake the thread at once


class RingWatch:
    """Own reader and thread on the ring buffer map `table` of the loaded program
    `bpf`. A subclass sets what its handlers use before calling this constructor (the
    thread starts in it), handles each record's bytes in `_on_record` (it must not
    raise: the thread would end) and may act after each poll in `_after_poll`."""

    def __init__(self, bpf: Any, table: str, thread_name: str) -> None:
        self.records = 0
        self._reader: ringbuf.RingReader | None = ringbuf.RingReader(
            bpf[table].map_fd, self._on_record)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)
        self._thread.start()

    def _on_record(self, data: bytes) -> None:
        raise NotImplementedError

    def _after_poll(self) -> None:
        """What the thread does after each poll (records handled, or the timeout)."""

    def _run(self) -> None:
        reader = self._reader
        assert reader is not None
        while not self._stop.is_set():
            if reader.wait(POLL_MS / 1000):
                reader.consume()
            self._after_poll()

    def close(self) -> None:
        """Stop the thread, then unmap the ring (never while it polls)."""
        self._stop.set()
        self._thread.join()
        if self._reader is not None:
            self._reader.close()
            self._reader = None
