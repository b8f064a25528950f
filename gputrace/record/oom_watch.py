"""The thread that hears "no memory" failures the moment the ioctl probe sees them.

The probe stages ioctl events and the recorder drains them every 50 ms; a failure
with NV_ERR_NO_MEMORY is also written alone to the `oom_events` ring buffer with a
wakeup (probes/nv_ioctl.bpf.h). This thread sleeps in epoll on that buffer alone,
through a reader of its own (record/ring_watch.py; the poll thread drains the
others), and fires the session's incident signal for each record, so the RM
sampler queries the GPU within about a millisecond of the failed call's return.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from gputrace.record import incidents
from gputrace.record.ring_watch import RingWatch


class OomWatch(RingWatch):
    """Own ring buffer reader and thread on the `oom_events` map of a loaded program."""

    def __init__(self, bpf: Any, signal: incidents.IncidentSignal, table: str = "oom_events",
                 api_names: Mapping[int, str] | None = None) -> None:
        """`table`: the ring buffer map; `api_names` for the API layer's (function ids)."""
        self.signal = signal
        self.api_names = api_names
        super().__init__(bpf, table, "gputrace-oom")

    def _on_record(self, data: bytes) -> None:
        if len(data) >= incidents.OOM_DTYPE.itemsize:
            rec = np.frombuffer(data[: incidents.OOM_DTYPE.itemsize], incidents.OOM_DTYPE)[0]
            self.records += 1
            # a subscriber's error must not unwind into C; the decoded row delivers it
            with contextlib.suppress(Exception):
                self.signal.fire(incidents.from_probe(rec, self.api_names), early=True)
