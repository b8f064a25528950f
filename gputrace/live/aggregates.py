"""What is live right now, and how fast is it changing? Running aggregates of a
recording, fed the decoded tables as the recorder appends them.

`Aggregates.observe(name, table)` is called from the recorder's writer thread
with each table it appended; `snapshot()` is called from any thread (the view,
the metrics endpoint, the alert evaluator) and returns a consistent copy. Only
vectorized work runs per row; Python loops run over allocation and free rows
(rare next to the ioctl flood) and over processes and GPUs.

Live bytes per layer (`api`, `rm`, `uvm`) and each process's one figure (the joined
model over its live allocations) are kept by `live_bytes.LiveBytes`; the views a
snapshot returns are in `snapshot`.

A process's memory ends with it: when its exit is seen, its series go away.
`growth` (leak rate) is the held bytes gained over the trailing window divided
by the window: (held now - held at now-W) / W, with 0 before the process was
first seen, so a process that grows 24 MiB in a 60 s window shows 0.4 MiB/s.
"""

from __future__ import annotations

import resource
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gputrace.analyses.helpers.rm_objects import ALLOCS, VID_HEAP
from gputrace.identity import Identity
from gputrace.live.live_bytes import UVM_NAMES, LiveBytes, Proc
from gputrace.live.snapshot import GpuView, ProcView, Snapshot
from gputrace.record import incidents

NS = 1_000_000_000
GROWTH_WINDOW_NS = 60 * NS
"""Window of the growth (leak) rate: long enough that one allocation burst is not
a trend, short enough to react within minutes."""
RATE_WINDOW_NS = 10 * NS
"""Window of the event rates (allocations, frees, faults, migrations per second)."""
SAMPLE_NS = NS // 4
"""At most one rate sample per process per quarter second."""
HELD_NS = NS
"""A process's held bytes (the join over its live allocations) are recomputed at most
once a second while tables arrive, and whenever a snapshot is read."""
HELD_ITEMS = 50_000
"""The join costs ~2 µs a live allocation (0.3 s for 150,000 on the 2-core VM): with
more live allocations than this in the processes to recompute, a recompute waits
HELD_NS per HELD_ITEMS since the last (3 s at 150,000), snapshots included, so it takes
about a tenth of a core at most; the view and metrics show the last figure meanwhile.
Counted, not timed, so the same input gives the same figures on a loaded machine."""
LATENCY_BUCKETS_S: tuple[float, ...] = (1e-6, 4e-6, 16e-6, 64e-6, 256e-6, 1e-3, 4e-3,
                                        16e-3, 64e-3, 0.256, 1.0)
"""Upper bounds of the ioctl latency histogram (seconds); +Inf is implied."""
ROUND_NS = 50_000_000
"""Rows of one round of the driver's per-process accounting are this close in time
(as analyses/oom/gpu_state.ROUND_NS)."""
MAX_DRIVER_PIDS = 100_000
"""Pids kept per round of the driver's accounting (docs/security.md): a driver that
lists more (a hostile or broken stand-in) cannot grow the recorder's memory."""
_BOUNDS_NS = np.array([round(b * NS) for b in LATENCY_BUCKETS_S], dtype=np.int64)


def mono_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def _own_stats() -> dict[str, Any]:
    """CPU time and peak RSS of this process, when the recorder offers no stats()."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    rss = ru.ru_maxrss * 1024
    try:
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        pass
    return {"cpu_seconds": ru.ru_utime + ru.ru_stime, "rss_bytes": rss}


class Aggregates:
    """Running per pid/comm/GPU/layer aggregates of the tables a recording appends."""

    def __init__(self, clock: Callable[[], int] = mono_ns,
                 growth_window_ns: int = GROWTH_WINDOW_NS,
                 stats: Callable[[], dict[str, Any]] | None = None,
                 who: Callable[[int], Identity | None] | None = None) -> None:
        """`who(pid)`: the process's container and pod, asked once per process when its
        first row arrives (the recorder read them at its first event)."""
        self.clock = clock
        self.who = who
        self.growth_window_ns = growth_window_ns
        self.stats_fn = stats
        self.lock = threading.Lock()
        self.procs: dict[int, Proc] = {}
        self.exited: set[int] = set()
        self.live_bytes = LiveBytes(self.procs, self._proc)
        self.ioctls: Counter[str] = Counter()
        self._lat: dict[str, np.ndarray[Any, Any]] = {}
        self._lat_sum: dict[str, float] = {}
        self.gpu_faults: Counter[tuple[int | None, str]] = Counter()
        self.fault_batches: Counter[int | None] = Counter()
        self.migrations: Counter[str] = Counter()
        self.migrated_bytes: Counter[str] = Counter()
        self.cpu_faults = 0
        self.gpus: dict[int, GpuView] = {}
        self.rows: Counter[str] = Counter()
        self.alerts: Counter[str] = Counter()
        self.ooms: Counter[tuple[int | None, str]] = Counter()  # (gpu, verdict)
        # the driver's latest per-process accounting: gpu -> (round ts, {pid: bytes})
        self.driver: dict[int, tuple[int, dict[int, int]]] = {}
        self._held_ns: int | None = None  # when held bytes were last recomputed

    # ------------------------------------------------------------ feeding
    def observe(self, name: str, table: pa.Table | pa.RecordBatch) -> None:
        """Fold one appended table in (writer thread)."""
        if table.num_rows == 0:
            return
        handler = _HANDLERS.get(name)
        with self.lock:
            self.rows[name] += table.num_rows
            now = self.clock()
            if handler is not None:
                handler(self, table, now)
            self._sample(now)

    def _proc(self, pid: int, comm: str | None, now: int) -> Proc:
        p = self.procs.get(pid)
        if p is None:
            p = self.procs[pid] = Proc(pid, comm or "", now)
            p.history.append((now, 0))
            ident = self.who(pid) if self.who is not None else None
            if ident is not None:
                p.who = ident.labels()
        elif comm and not p.comm:
            p.comm = comm
        return p

    def _ioctls(self, t: pa.Table | pa.RecordBatch, now: int) -> None:
        self._ooms("ioctls", t)
        name = t.column("name")
        if isinstance(name, pa.ChunkedArray):
            name = name.combine_chunks()
        if not pa.types.is_dictionary(name.type):
            name = pc.dictionary_encode(name)
        assert isinstance(name, pa.DictionaryArray)
        names: list[str] = [str(x) for x in name.dictionary.to_pylist()]
        idx = name.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        per = np.bincount(idx, minlength=len(names))
        lat_col = t.column("latency_ns")
        lat = np.asarray(lat_col.to_numpy(zero_copy_only=False), dtype=np.float64)
        ok = ~np.isnan(lat)
        nb = len(_BOUNDS_NS) + 1
        bucket = np.searchsorted(_BOUNDS_NS, lat[ok], side="left")
        hist = np.bincount(idx[ok] * nb + bucket, minlength=len(names) * nb)
        sums = np.bincount(idx[ok], weights=lat[ok], minlength=len(names))
        for i, n in enumerate(names):
            if per[i]:
                self.ioctls[n] += int(per[i])
                h = self._lat.setdefault(n, np.zeros(nb, dtype=np.int64))
                h += hist[i * nb:(i + 1) * nb]
                self._lat_sum[n] = self._lat_sum.get(n, 0.0) + float(sums[i]) / NS
        # memory: only the RM object and UVM mapping rows go through Python
        rm = {i for i, n in enumerate(names) if n in (*ALLOCS, VID_HEAP, "RM_FREE")}
        uvm = {i for i, n in enumerate(names) if n in UVM_NAMES}
        sel = np.isin(idx, [*rm, *uvm])
        if not sel.any():
            return
        rows = t.filter(pa.array(sel)).select(
            ["ts_ns", "pid", "tid", "comm", "name", "gpu_index", "ret", "status", "latency_ns",
             "h_client", "h_parent", "h_object", "h_class", "size_bytes", "flags", "va_base",
             "va_length"]).to_pylist()
        for r in rows:
            if r["name"] in UVM_NAMES:
                self.live_bytes.uvm_row(r, now)
            else:
                self.live_bytes.rm_row(r, now)

    def _cuda_calls(self, t: pa.Table | pa.RecordBatch, now: int) -> None:
        self.live_bytes.cuda_calls(t, now)
        self._ooms("cuda_calls", t)

    def _ooms(self, name: str, t: pa.Table | pa.RecordBatch) -> None:
        """Allocations refused for want of memory, by the verdict of the latest GPU
        memory sample (the API layer names no GPU: the only one sampled, if one)."""
        tbl = t if isinstance(t, pa.Table) else pa.Table.from_batches([t])
        for o in incidents.incidents(name, tbl):
            g = o.gpu_index if o.gpu_index is not None or len(self.gpus) != 1 else next(
                iter(self.gpus))
            gv = self.gpus.get(g) if g is not None else None
            sample = None if gv is None else {"heap_free_bytes": gv.free_bytes,
                                              "largest_free_bytes": gv.largest_free_bytes}
            self.ooms[(g, incidents.verdict(o.size_bytes, sample))] += 1

    def _mappings(self, t: pa.Table | pa.RecordBatch, now: int) -> None:
        self.live_bytes.mappings(t, now)

    def _processes(self, t: pa.Table | pa.RecordBatch, now: int) -> None:
        cols = t.select(["pid", "comm", "exit_ts_ns"]).to_pydict()
        for pid, comm, exit_ts in zip(*cols.values(), strict=True):
            if exit_ts is None:
                if comm:
                    self._proc(pid, comm, now).comm = comm
                continue
            self.exited.add(pid)
            self.procs.pop(pid, None)
            self.live_bytes.forget(pid)

    def _faults(self, t: pa.Table | pa.RecordBatch, now: int) -> None:
        src = t.column("source").to_pylist()
        gpu = t.column("gpu_index").to_pylist()
        pid = t.column("pid").to_pylist()
        for key, n in Counter(zip(gpu, src, pid, strict=True)).items():
            g, s, p = key
            if s == "cpu":
                self.cpu_faults += n
                if p is not None:
                    self._proc(p, None, now).cpu_faults += n
            else:
                self.gpu_faults[(g, s or "unknown")] += n
                if p is not None:
                    self._proc(p, None, now).gpu_faults += n

    def _fault_batches(self, t: pa.Table | pa.RecordBatch, now: int) -> None:
        for g, n in Counter(t.column("gpu_index").to_pylist()).items():
            self.fault_batches[g] += n

    def _migrations(self, t: pa.Table | pa.RecordBatch, now: int) -> None:
        cols = t.select(["cause", "size_bytes", "pid"]).to_pydict()
        for cause, size, pid in zip(*cols.values(), strict=True):
            c = cause or "unknown"
            self.migrations[c] += 1
            self.migrated_bytes[c] += size or 0
            if pid is not None:
                self._proc(pid, None, now).migrations += 1

    def _gpu_memory(self, t: pa.Table | pa.RecordBatch, now: int) -> None:
        cols = t.select(["ts_ns", "gpu_index", "heap_size_bytes", "heap_free_bytes",
                         "largest_free_bytes", "status"]).to_pydict()
        for ts, g, heap, free, largest, status in zip(*cols.values(), strict=True):
            old = self.gpus.get(g)
            if status == 0 and (old is None or ts >= old.ts_ns):
                self.gpus[g] = GpuView(g, heap, free, largest, ts)

    def _gpu_process_memory(self, t: pa.Table | pa.RecordBatch, now: int) -> None:
        """Keep each GPU's latest round of the driver's per-process accounting (rows of
        one round are within `ROUND_NS` of its first), at most `MAX_DRIVER_PIDS` pids."""
        cols = t.select(["ts_ns", "gpu_index", "pid", "vidmem_bytes"]).to_pydict()
        for ts, g, pid, b in zip(*cols.values(), strict=True):
            old = self.driver.get(g)
            if old is None or ts >= old[0] + ROUND_NS:
                old = self.driver[g] = (ts, {})
            elif ts < old[0]:
                continue  # an older round arriving late
            if b is not None and len(old[1]) < MAX_DRIVER_PIDS:
                old[1][pid] = b

    def orphaned(self) -> dict[int, int]:
        """Per GPU, bytes the driver charges to pids with no live traced process."""
        return {g: sum(b for pid, b in by_pid.items() if pid not in self.procs)
                for g, (_ts, by_pid) in sorted(self.driver.items())}

    def _refresh_held(self, now: int, force: bool) -> None:
        """Recompute the held bytes of the processes whose allocations changed."""
        stale = [p for p in self.procs.values() if p.stale]
        if not stale:
            return
        items = self.live_bytes.count(p.pid for p in stale)
        wait = HELD_NS * max(1, items // HELD_ITEMS) if (items > HELD_ITEMS or not force) else 0
        if self._held_ns is not None and now - self._held_ns < wait:
            return
        self._held_ns = now
        held = self.live_bytes.held(p.pid for p in stale)
        for p in stale:
            p.held_bytes, p.stale = held[p.pid], False

    def _sample(self, now: int, force: bool = False) -> None:
        """Record each process's change points and rate samples; prune old ones."""
        self._refresh_held(now, force)
        horizon = now - self.growth_window_ns
        for p in self.procs.values():
            total = p.held_bytes
            if p.history[-1][1] != total:
                p.history.append((now, total))
            while len(p.history) > 1 and p.history[1][0] <= horizon:
                p.history.popleft()
            s = (now, sum(p.allocations.values()), sum(p.frees.values()), p.gpu_faults,
                 p.migrations)
            if not p.samples or now - p.samples[-1][0] >= SAMPLE_NS:
                p.samples.append(s)
            else:
                p.samples[-1] = (p.samples[-1][0], *s[1:])
            while len(p.samples) > 2 and p.samples[1][0] <= now - RATE_WINDOW_NS:
                p.samples.popleft()

    # ------------------------------------------------------------ reading
    def note_alert(self, name: str) -> None:
        with self.lock:
            self.alerts[name] += 1

    def growth(self, p: Proc, now: int) -> float:
        """Bytes per second gained over the trailing window (0 before first seen)."""
        start = now - self.growth_window_ns
        before = 0
        for ts, total in p.history:
            if ts > start:
                break
            before = total
        return (p.held_bytes - before) / (self.growth_window_ns / NS)

    @staticmethod
    def _rates(p: Proc, now: int) -> tuple[float, float, float, float]:
        first = p.samples[0] if p.samples else (now, 0, 0, 0, 0)
        if p.samples and p.samples[0][0] == p.first_ns:
            first = (p.first_ns, 0, 0, 0, 0)  # counted from zero at first sight
        span = max(now - first[0], NS) / NS
        last = (now, sum(p.allocations.values()), sum(p.frees.values()), p.gpu_faults,
                p.migrations)
        return tuple((last[i] - first[i]) / span for i in range(1, 5))  # type: ignore[return-value]

    def snapshot(self) -> Snapshot:
        """A consistent copy of everything, with rates computed at the current time."""
        stats = self.stats_fn() if self.stats_fn is not None else {}
        own = _own_stats()
        with self.lock:
            now = self.clock()
            self._sample(now, force=True)
            procs = []
            for p in self.procs.values():
                a, f, gf, m = self._rates(p, now)
                procs.append(ProcView(
                    p.pid, p.comm, dict(p.live), p.held_bytes, dict(p.allocations),
                    dict(p.frees), p.gpu_faults, p.cpu_faults, p.migrations,
                    self.growth(p, now), a, f, gf, m, p.who))  # fmt: skip
            lat = {n: (h.tolist(), self._lat_sum.get(n, 0.0)) for n, h in self._lat.items()}
            return Snapshot(
                ts_ns=now, procs=procs, gpus=sorted(self.gpus.values(), key=lambda g: g.index),
                ioctls=dict(self.ioctls), ioctl_latency=lat, gpu_faults=dict(self.gpu_faults),
                fault_batches=dict(self.fault_batches),
                migrations={c: (n, self.migrated_bytes[c]) for c, n in self.migrations.items()},
                cpu_faults=self.cpu_faults,
                rows={**dict(self.rows), **stats.get("rows", {})},
                drops=dict(stats.get("drops", {})),
                decode_errors=dict(stats.get("decode_errors", {})),
                cpu_seconds=float(stats.get("cpu_seconds", own["cpu_seconds"])),
                rss_bytes=int(stats.get("rss_bytes", own["rss_bytes"])),
                alerts=dict(self.alerts), exited=len(self.exited), ooms=dict(self.ooms),
                orphaned=self.orphaned(),
            )  # fmt: skip


_HANDLERS: dict[str, Callable[[Aggregates, Any, int], None]] = {
    "ioctls": Aggregates._ioctls,
    "cuda_calls": Aggregates._cuda_calls,
    "mappings": Aggregates._mappings,
    "processes": Aggregates._processes,
    "faults": Aggregates._faults,
    "fault_batches": Aggregates._fault_batches,
    "migrations": Aggregates._migrations,
    "gpu_memory": Aggregates._gpu_memory,
    "gpu_process_memory": Aggregates._gpu_process_memory,
}
