"""The GPU memory sampler: a thread that asks the recorder's RM client for every GPU's
free memory and largest free region every N ms, and hands the rows to the driver
layer (`take`).
"""

from __future__ import annotations

import math
import threading
import time

from gputrace.errors import UsageError
from gputrace.record.driver_layer.samples import GpuMemorySample
from gputrace.record.rm_query.client import RmClient

DEFAULT_SAMPLE_MS = 100.0


def validate_interval_ms(ms: float) -> float:
    """The sample interval in ms, or UsageError when it is not a finite number > 0."""
    if not isinstance(ms, (int, float)) or not math.isfinite(ms) or ms <= 0:
        raise UsageError(f"GPU memory sample interval must be a finite number of ms > 0, not {ms}")
    return float(ms)


class MemorySampler:
    """A thread that samples every GPU of an `RmClient` every `interval_ms`."""

    def __init__(self, client: RmClient, interval_ms: float = DEFAULT_SAMPLE_MS) -> None:
        self.client = client
        self.interval_s = validate_interval_ms(interval_ms) / 1000.0
        self._rows: list[GpuMemorySample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.tid: int | None = None
        self.samples = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gputrace-gpu-memory",
                                        daemon=True)  # fmt: skip
        self._thread.start()

    def _run(self) -> None:
        self.tid = threading.get_native_id()
        next_t = time.monotonic()
        while not self._stop.is_set():
            self.sample_once()
            next_t += self.interval_s
            now = time.monotonic()
            if next_t < now:  # fell behind (slow RM): skip, do not burst
                next_t = now + self.interval_s
            self._stop.wait(next_t - now)

    def sample_once(self) -> None:
        rows = [self.client.sample(g) for g in self.client.gpus]
        with self._lock:
            self._rows += rows
            self.samples += 1

    def take(self) -> list[GpuMemorySample]:
        """Rows sampled since the last take."""
        with self._lock:
            rows, self._rows = self._rows, []
        return rows

    def stop(self) -> None:
        """Stop the thread after one last sample; the client stays open (caller closes)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
