"""One traced process of the driver layer, as its consumer thread sees it: the UVM
tools tracker attached to it and what the drains took from it so far (record
bytes, processor table, drop and transfer counters, close time).

Answers two questions for `poller.DriverPoller`: what one drain or the final
flush-and-close does to a tracker (`TrackedProcess.drain`, `TrackedProcess.close`), and how the
drained bytes are cut into decoder feeds (`coalesce`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from gputrace.record.uvm_tools import abi as uvm_tools_abi
from gputrace.record.uvm_tools import tracker as uvm_tools
from gputrace.record.uvm_tools.decode import UvmStreamDecoder

TABLE_REREAD_NS = 1_000_000_000  # re-read a processor table at most once a second
FEED_RECORDS = 16_384
"""At most this many records per decoder feed. The decoder holds the GIL through
each numpy call, so a huge feed would keep the consumer thread from draining while
the driver fills the queue; 16k records is also the decoder's fastest feed size
(benchmarks/uvm_drain)."""


def mono_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


@dataclass
class TrackedProcess:
    """One traced process with a tracker; the decoder is touched only by poll()."""

    pid: int
    tracker: uvm_tools.Tracker
    attached_ts_ns: int
    chunks: list[bytes] = field(default_factory=list)  # drained records
    table: list[bytes] | None = None
    table_ts_ns: int = 0
    dropped: list[int] = field(default_factory=lambda: [0] * uvm_tools_abi.NUM_EVENT_TYPES)
    counters: list[int] | None = None
    counters_ts_ns: int = 0
    closed_ts_ns: int | None = None
    decoder: UvmStreamDecoder | None = None
    bytes_drained: int = 0

    def drain(self, entry_size: int) -> int:
        """Drain the queue; the number of records it held."""
        data = self.tracker.drain()
        if data:
            self.chunks.append(data)
            self.bytes_drained += len(data)
            now = mono_ns()
            if self.table is None or now - self.table_ts_ns >= TABLE_REREAD_NS:
                table = self.tracker.processors()
                if table is not None:
                    self.table, self.table_ts_ns = table, now
        self.dropped = self.tracker.dropped()
        return len(data) // entry_size

    def close(self, entry_size: int) -> None:
        """Final flush and drain, then release the tracker and the duplicated fd."""
        self.tracker.flush()
        self.drain(entry_size)
        if self.table is None:
            self.table = self.tracker.processors()
        self.counters = self.tracker.counters()
        self.counters_ts_ns = mono_ns()
        self.tracker.close()
        self.closed_ts_ns = mono_ns()


def coalesce(chunks: Sequence[bytes], max_bytes: int) -> list[bytes]:
    """Consecutive drains joined into feeds of at most `max_bytes` (whole records:
    a multiple of the entry size). The clock map is a function of each record's raw
    time, so where a feed is cut never changes a timestamp."""
    out: list[bytes] = []
    run: list[bytes] = []
    size = 0
    for data in chunks:
        view = memoryview(data)
        while len(view):
            if size == max_bytes:
                out.append(run[0] if len(run) == 1 else b"".join(run))
                run, size = [], 0
            piece = view[: max_bytes - size]
            run.append(bytes(piece) if len(piece) < len(data) else data)
            size += len(piece)
            view = view[len(piece) :]
    if run:
        out.append(run[0] if len(run) == 1 else b"".join(run))
    return out
