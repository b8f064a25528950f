"""The driver layer the recorder polls: UVM tools trackers on the traced processes
(GPU faults, fault batches, migrations, thrashing, counters) and GPU memory
sampled from RM, with no kernel probe. docs/driver-layer.md describes the API.

One consumer thread drains every tracker's queue every `drain_ms` as bytes and
closes a tracker within one period of its process's exit (its pidfd turns
readable). `poll()`, called from the recorder's loop, decodes what was drained
in bulk (`decode_uvm`) and returns Arrow tables ready for the trace writer.
Each traced process's tracker state and drains are in `uvm_target`; what the
layer writes into the manifest is in `driver_manifest`.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from gputrace.record import driver_version as driver
from gputrace.record.driver_layer import manifest as driver_manifest
from gputrace.record.driver_layer import samples as driver_samples
from gputrace.record.fdtake import FdTaker, TakeError
from gputrace.record.rm_query import client as rm_client
from gputrace.record.rm_query import sampler as memory_sampler
from gputrace.record.uvm_tools import abi as uvm_tools_abi
from gputrace.record.uvm_tools import clock as uvm_clock
from gputrace.record.uvm_tools import gpu_uuids
from gputrace.record.uvm_tools import tracker as uvm_tools
from gputrace.record.uvm_tools.decode import UvmStreamContext, UvmStreamDecoder
from gputrace.record.uvm_tools.target import FEED_RECORDS, TrackedProcess, coalesce, mono_ns

DEFAULT_DRAIN_MS = 10.0
BUSY_SHARE = 4
"""A drain that found more than 1/BUSY_SHARE of a queue filled is followed at once by
the next one instead of a full drain period."""

Tables = dict[str, list[pa.Table]]


class DriverPoller:
    """UVM tools trackers plus the RM GPU memory sampler, behind one poll() call."""

    def __init__(
        self,
        devdir: str,
        driver_version: str | None,
        queue_entries: int = uvm_tools.DEFAULT_QUEUE_ENTRIES,
        sample_ms: float = memory_sampler.DEFAULT_SAMPLE_MS,
        pid_sample_ms: float = memory_sampler.DEFAULT_PID_SAMPLE_MS,
        drain_ms: float = DEFAULT_DRAIN_MS,
        proc_root: str = "/",
        rm: bool = True,
        gpu_uuids: Mapping[bytes, int] | None = None,
        queue_version: int | None = None,
    ) -> None:
        self.devdir = os.path.abspath(devdir)
        self.sample_ms = memory_sampler.validate_interval_ms(sample_ms)
        self.pid_sample_ms = memory_sampler.validate_interval_ms(pid_sample_ms)
        self.drain_s = memory_sampler.validate_interval_ms(drain_ms) / 1000.0
        if queue_entries < 2 or queue_entries & (queue_entries - 1):
            raise uvm_tools.ToolsError(
                f"queue entries must be a power of two >= 2, not {queue_entries}"
            )
        self.queue_entries = queue_entries
        self.info = driver.resolve(driver_version)
        self.version = driver.parse_version(self.info.layout_version)
        # queue_version: a queue format other than the driver's newest (1 = 64-byte
        # records); None takes the newest.
        self.abi = uvm_tools_abi.tools_abi(self.version, queue_version)
        self.proc_root = proc_root
        self.want_rm = rm
        self.rm: rm_client.RmClient | None = None
        self.sampler: memory_sampler.MemorySampler | None = None
        self.rm_error: str | None = None
        self._targets: dict[int, TrackedProcess] = {}
        self._done: list[TrackedProcess] = []  # closed and fully collected (manifest)
        self.failures: list[dict[str, Any]] = []
        self.missed: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.consumer_tid: int | None = None
        self.error: str | None = None
        self.clock = uvm_clock.RawClock()  # (raw, mono) points: the records' clock map
        self._last_counters_ns = 0
        self._taker: FdTaker | None = None  # takes the targets' uvm fds (fdtake)
        self._given_uuids = dict(gpu_uuids or {})
        self._gpu_uuids: dict[bytes, int] = dict(self._given_uuids)

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Open the RM client and start the sampler and the consumer thread."""
        self._note_clock()
        self._gpu_uuids = {**rm_client.proc_gpu_uuids(self.proc_root), **self._given_uuids}
        if self.want_rm:
            try:
                self.rm = rm_client.RmClient.open(self.devdir, self.version, self.proc_root)
            except rm_client.RmError as e:
                self.rm_error = str(e)
            else:
                self._gpu_uuids = {**self.rm.gpu_uuids(), **self._gpu_uuids}
                self.sampler = memory_sampler.MemorySampler(self.rm, self.sample_ms,
                                                            self.pid_sample_ms)
                self.sampler.start()
        with contextlib.suppress(uvm_tools.ToolsError, TakeError):
            # started before any target runs: its first answer is not its start-up
            self._taker = FdTaker(uvm_tools.uvm_identity(self.devdir))
            self._taker.start()
        self._thread = threading.Thread(target=self._run, name="gputrace-uvm-tools", daemon=True)
        self._thread.start()

    def incident(self, failed_ns: int, gpu_index: int | None) -> None:
        """A "no memory" failure returned at `failed_ns` on `gpu_index` (None:
        unknown): the RM sampler queries that GPU now (no-op without RM)."""
        if self.sampler is not None:
            self.sampler.incident(failed_ns, gpu_index)

    @property
    def pid(self) -> int:
        """The process whose ioctls the syscall layer must not record (the recorder)."""
        return os.getpid()

    def own_tids(self) -> list[int]:
        """Threads of this layer that issue ioctls (sampler, consumer)."""
        tids = [self.consumer_tid, self.sampler.tid if self.sampler else None]
        return [t for t in tids if t is not None]

    def attach(
        self, pid: int, *, already_running: bool = False, fds: Sequence[int] | None = None
    ) -> bool:
        """Attach a tracker to `pid` (after its UVM_INITIALIZE, or at start when it
        already has a uvm fd: `already_running`). False, with the reason in the
        manifest, when it cannot be attached."""
        with self._lock:
            if pid in self._targets:
                return True
        try:
            if self._taker is None:
                self._taker = FdTaker(uvm_tools.uvm_identity(self.devdir))
            tr = uvm_tools.Tracker.open(pid, self.devdir, self.abi, self.queue_entries, fds,
                                        self._taker)  # fmt: skip
        except uvm_tools.ToolsError as e:
            self.failures.append({"pid": pid, "error": str(e)})
            return False
        except OSError as e:  # unexpected: still one line in the manifest, not a crash
            self.failures.append({"pid": pid, "error": f"{e.strerror or e}"})
            return False
        now = mono_ns()
        t = TrackedProcess(pid, tr, now)
        if tr.info is not None and tr.info.counters_error:
            self.failures.append({"pid": pid, "error": f"counters: {tr.info.counters_error}"})
        if already_running:
            self.missed.append({"pid": pid, "attached_ts_ns": now})
        with self._lock:
            self._targets[pid] = t
        return True

    def poll(self) -> Tables:
        """Drain all queues, close trackers of exited processes, and return the
        decoded tables (by table name) ready for the trace writer."""
        self._service()
        return self._collect(final=False)

    def stop(self) -> Tables:
        """Flush and drain every tracker, close everything, return the last tables."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            for t in self._targets.values():
                if t.closed_ts_ns is None:
                    t.close(self.abi.entry_size)
            self._note_clock()  # after the last drains: their records are inside the map
        if self._taker is not None:
            self._taker.close()
            self._taker = None
        if self.sampler is not None:
            self.sampler.stop()
        out = self._collect(final=True)
        if self.rm is not None:
            self.rm.close()
        return out

    # ------------------------------------------------------------ consumer
    def _run(self) -> None:
        self.consumer_tid = threading.get_native_id()
        busy = False
        while not self._stop.wait(0 if busy else self.drain_s):
            try:
                busy = self._service()
            except Exception as e:  # keep recording the other layers; say what stopped
                self.error = f"driver layer consumer stopped: {type(e).__name__}: {e}"
                return

    def _service(self) -> bool:
        """Drain every open tracker; close those whose process exited. True when a
        queue was more than 1/BUSY_SHARE full (drain again at once)."""
        busy = False
        with self._lock:
            live = [t for t in self._targets.values() if t.closed_ts_ns is None]
            if not live:
                return False
            for t in live:
                # Check exit before draining: records written before the exit
                # are then all in this drain, with the flush in TrackedProcess.close.
                gone = t.tracker.exited()
                busy |= t.drain(self.abi.entry_size) * BUSY_SHARE > self.queue_entries
                if gone:
                    t.close(self.abi.entry_size)
            # measured after the drains: every record drained so far lies at or
            # before this point, so its segment of the clock map is final
            self._note_clock()
        return busy

    def _note_clock(self) -> None:
        """Add a (raw, mono) point to the clock map (caller holds the lock, or
        the consumer thread is not running)."""
        self.clock.add(*uvm_clock.measure())

    # ------------------------------------------------------------ decoding
    def _collect(self, final: bool) -> Tables:
        out: Tables = {}

        def add(tables: dict[str, pa.Table]) -> None:
            for name, tab in tables.items():
                if tab.num_rows:
                    out.setdefault(name, []).append(tab)

        now = mono_ns()
        counters_due = final or now - self._last_counters_ns >= self.sample_ms * 1e6
        with self._lock:
            work = []
            for t in self._targets.values():
                chunks, t.chunks = t.chunks, []
                counters = None
                if t.closed_ts_ns is not None:
                    counters = t.counters
                elif counters_due:
                    counters = t.tracker.counters()
                work.append((t, chunks, t.table, counters, t.closed_ts_ns is not None))
            clock = self.clock.snapshot()  # covers every chunk just taken
        if counters_due:
            self._last_counters_ns = now
        for t, chunks, table, counters, closed in work:
            mapping = gpu_uuids.processor_map(table, self._gpu_uuids)
            if chunks and t.decoder is None:
                t.decoder = UvmStreamDecoder(
                    UvmStreamContext(
                        t.pid, self.abi.version, self.abi.cpu_fault_has_cpu_id, mapping
                    )
                )
            elif chunks and t.decoder is not None:
                t.decoder.set_processors(mapping)  # GPUs registered since it was built
            for data in coalesce(chunks, FEED_RECORDS * self.abi.entry_size):
                assert t.decoder is not None
                add(t.decoder.feed(data, clock))
                time.sleep(0)  # let the consumer thread take the GIL between feeds
            if counters is not None:
                add({"uvm_counters": driver_samples.counters_table(now, t.pid, counters)})
            if closed:
                if t.decoder is not None:
                    add(t.decoder.finish())
                with self._lock:
                    self._targets.pop(t.pid, None)
                self._done.append(t)
        if self.sampler is not None:
            rows = self.sampler.take()
            if rows:
                add({"gpu_memory": driver_samples.gpu_memory_table(rows)})
            procs = self.sampler.take_processes()
            if procs:
                add({"gpu_process_memory": driver_samples.gpu_process_memory_table(procs)})
        return out

    def attached_pids(self) -> list[int]:
        """Every process a tracker was attached to (open or already closed)."""
        with self._lock:
            return sorted({t.pid for t in [*self._done, *self._targets.values()]})

    def bad_records(self) -> int:
        """Records the decoders skipped as unreadable so far (all trackers)."""
        with self._lock:
            targets = [*self._done, *self._targets.values()]
        return sum(t.decoder.bad_records for t in targets if t.decoder is not None)

    # ------------------------------------------------------------ manifest
    def manifest(self) -> dict[str, Any]:
        """Manifest fragment: layers, drops, clock note, `driver_layer` facts
        (driver_manifest.fragment)."""
        with self._lock:
            targets = [*self._done, *self._targets.values()]
        return driver_manifest.fragment(self, targets, self._gpu_uuids)

    def clock_offsets(self) -> npt.NDArray[np.int64]:
        """Offsets (mono - raw) of the clock map's points so far."""
        with self._lock:
            return self.clock.offsets()


def close_quietly(layer: DriverPoller | None) -> None:
    """Stop a layer on an error path without letting a second error hide the first."""
    if layer is not None:
        with contextlib.suppress(Exception):
            layer.stop()
