"""The GPU memory sampler: a thread that asks the recorder's RM client for every GPU's
free memory and largest free region every N ms, and the driver's per-process video
memory every M ms (slower: one query per 200 processes), and hands the rows to the
driver layer (`take`, `take_processes`).

An incident (`incident()`: a "no memory" failure the recorder just heard of) queries
that GPU's free memory at once (every GPU when the failure does not name one) and
wakes the thread for its processes: rows marked `incident`, the memory sample with
the delay from the failed call's return.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time

from gputrace.errors import UsageError
from gputrace.record.driver_layer.samples import GpuMemorySample, GpuProcessMemorySample
from gputrace.record.rm_query.client import RmClient, RmGpu

DEFAULT_SAMPLE_MS = 100.0
DEFAULT_PID_SAMPLE_MS = 1000.0


def validate_interval_ms(ms: float) -> float:
    """The sample interval in ms, or UsageError when it is not a finite number > 0."""
    if not isinstance(ms, (int, float)) or not math.isfinite(ms) or ms <= 0:
        raise UsageError(f"GPU memory sample interval must be a finite number of ms > 0, not {ms}")
    return float(ms)


class MemorySampler:
    """A thread that samples every GPU of an `RmClient` every `interval_ms`, its
    processes every `pid_interval_ms`, and at once on `incident()`."""

    def __init__(self, client: RmClient, interval_ms: float = DEFAULT_SAMPLE_MS,
                 pid_interval_ms: float = DEFAULT_PID_SAMPLE_MS) -> None:
        self.client = client
        self.interval_s = validate_interval_ms(interval_ms) / 1000.0
        self.pid_interval_s = validate_interval_ms(pid_interval_ms) / 1000.0
        self._rows: list[GpuMemorySample] = []
        self._proc_rows: list[GpuProcessMemorySample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()  # stop or an incident
        self._pending: set[int] = set()  # GPUs whose processes an incident wants asked
        self._incident_lock = threading.Lock()
        self._last_incident: dict[int, int] = {}  # gpu -> ts of its last incident sample
        self._thread: threading.Thread | None = None
        self.tid: int | None = None
        self.samples = 0
        self.pid_samples = 0
        self.pid_failures = 0  # GET_PIDS queries RM refused
        self.incident_samples = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gputrace-gpu-memory",
                                        daemon=True)  # fmt: skip
        self._thread.start()

    def _run(self) -> None:
        self.tid = threading.get_native_id()
        next_t = next_pid_t = time.monotonic()
        while not self._stop.is_set():
            self.sample_incidents()
            now = time.monotonic()
            if now >= next_t:
                self.sample_once()
                next_t += self.interval_s
                if next_t < now:  # fell behind (slow RM): skip, do not burst
                    next_t = now + self.interval_s
            if now >= next_pid_t:
                self.sample_processes()
                next_pid_t = max(next_pid_t + self.pid_interval_s, now)
            self._wake.wait(max(0.0, min(next_t, next_pid_t) - time.monotonic()))
            self._wake.clear()

    def sample_once(self) -> None:
        rows = [self.client.sample(g) for g in self.client.gpus]
        with self._lock:
            self._rows += rows
            self.samples += 1

    def _processes(self, gpus: list[RmGpu], trigger: str) -> list[GpuProcessMemorySample]:
        rows: list[GpuProcessMemorySample] = []
        failed = 0
        for g in gpus:
            st, got = self.client.process_memory(g, trigger)
            failed += st != 0
            rows += got
        with self._lock:
            self.pid_failures += failed
        return rows

    def sample_processes(self) -> None:
        rows = self._processes(self.client.gpus, "tick")
        with self._lock:
            self._proc_rows += rows
            self.pid_samples += 1

    def incident(self, failed_ns: int, gpu_index: int | None) -> None:
        """A "no memory" failure returned at `failed_ns` (CLOCK_MONOTONIC) on
        `gpu_index` (None: unknown, every GPU). FB_GET_INFO_V2 is asked here, in the
        caller's thread (the free memory the failure met: no hand-over to wait for);
        the per-process query, slower, follows in the sampler's thread. A GPU already
        sampled for an incident after this failure returned is not asked again: that
        sample shows what this failure left (a retry loop costs one query per GPU)."""
        rows = []
        with self._incident_lock:  # incident callers query one at a time
            for g in self.client.gpus:
                if gpu_index is not None and g.gpu_index != gpu_index:
                    continue
                if self._last_incident.get(g.gpu_index, -1) >= failed_ns:
                    continue
                r = self.client.sample(g)
                self._last_incident[g.gpu_index] = r.ts_ns
                rows.append(dataclasses.replace(r, trigger="incident",
                                                delay_ns=r.ts_ns - failed_ns))
        if not rows:
            return
        with self._lock:
            self._rows += rows
            self.incident_samples += len(rows)
            self._pending |= {r.gpu_index for r in rows}
        self._wake.set()

    def sample_incidents(self) -> None:
        """The per-process samples incidents left pending, one per GPU."""
        with self._lock:
            pending, self._pending = self._pending, set()
        if not pending:
            return
        procs = self._processes([g for g in self.client.gpus if g.gpu_index in pending],
                                "incident")
        with self._lock:
            self._proc_rows += procs

    def take(self) -> list[GpuMemorySample]:
        """Rows sampled since the last take."""
        with self._lock:
            rows, self._rows = self._rows, []
        return rows

    def take_processes(self) -> list[GpuProcessMemorySample]:
        """Per-process rows sampled since the last take."""
        with self._lock:
            rows, self._proc_rows = self._proc_rows, []
        return rows

    def stop(self) -> None:
        """Stop the thread after one last sample; the client stays open (caller closes)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.sample_incidents()  # failures decoded while it stopped still get theirs
