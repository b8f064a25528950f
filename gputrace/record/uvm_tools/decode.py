"""Decode the UVM tools event queue into table rows.

The recorder drains each process's UVM tools queue as raw bytes; this module
turns those bytes into Arrow tables in bulk: one numpy structured view over
the whole buffer per record kind, never one Python object per event. Pure
numpy/pyarrow: it needs neither root nor bcc, so it runs on recorded bytes.

What the bytes mean (layouts, record kinds, the tools ABI's enum codes) is in
`uvm_records`; fault batches that span drains are kept by `uvm_batches`; the
Arrow columns are built by `arrow_columns`. Processor indices in the records
are tools indices (the CPU is 0), mapped to trace GPU indices (the CPU is -1)
through `UvmStreamContext.processors`.

CPU timestamps in the records are CLOCK_MONOTONIC_RAW; the recorder passes in the
map to CLOCK_MONOTONIC (`uvm_clock`: a pure function of the raw time). GPU
timestamps (`*_gpu_ns`) are the GPU's global timer, kept as they are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from gputrace.record.arrow_columns import Col, build_table, const
from gputrace.record.uvm_tools.batches import OpenBatches, batch_key, split_key
from gputrace.record.uvm_tools.clock import RawMap
from gputrace.record.uvm_tools.records import (
    ACCESS_LUT,
    CAUSE_LUT,
    CLIENT_GPC,
    CLIENT_HUB,
    CPU_FAULT,
    DTYPES,
    ENTRY_SIZE,
    FATAL_FAULT,
    FATAL_LUT,
    FAULT_TYPE_LUT,
    GPU_FAULT,
    GPU_FAULT_REPLAY,
    LAYOUTS,
    MAP_REMOTE,
    MIGRATION,
    READ_DUPLICATE,
    READ_DUPLICATE_INVALIDATE,
    REMOTE_LUT,
    SOURCE_LUT,
    THRASHING,
    THROTTLING_END,
    THROTTLING_START,
    Records,
    code,
)

_NO_GPU = np.int32(-(1 << 20))
"""Lookup value of a processor index missing from the context's table."""


@dataclass(frozen=True)
class UvmStreamContext:
    """What the decoder needs to know about one process's tools queue."""

    pid: int
    version: int
    """Queue entry layout: 1 (UvmEventEntry, 64 B) or 2 (UvmEventEntry_V2, 72 B)."""
    cpu_fault_has_cpu_id: bool
    """V1 CpuFaultInfo gained cpuId in 565.57.01 (before: padding)."""
    processors: Mapping[int, int]
    """Tools processor index -> trace gpu_index; the CPU maps to -1."""


class UvmStreamDecoder:
    """Decodes successive drains of one tools queue into `faults`, `fault_batches`,
    `migrations` and `uvm_events` tables.

    A fault batch closes at its replay event; faults of batches still open at the
    end of a drain wait for later drains (`finish` flushes them without a replay).
    Records that cannot be decoded (unknown or invalid type, a truncated tail) are
    counted in `bad_records`; rows naming a processor index missing from the
    context's table get a null GPU, or are dropped where the column cannot be null
    (migrations), and are counted in `unmapped_records`. `events` tallies every
    record by type. Batches still open between drains are kept by `OpenBatches`.
    """

    def __init__(self, ctx: UvmStreamContext) -> None:
        if ctx.version not in ENTRY_SIZE:
            raise ValueError(f"unknown UVM tools queue version {ctx.version}")
        self.ctx = ctx
        self.entry_size = ENTRY_SIZE[ctx.version]
        self.bad_records = 0
        self.unmapped_records = 0
        self.events: dict[int, int] = {}
        self._proc = np.full(1 << 16, _NO_GPU, np.int32)
        for k, v in ctx.processors.items():
            if 0 <= k < 1 << 16:
                self._proc[k] = v
        self._dtypes = {t: DTYPES[(ctx.version, t)] for t in LAYOUTS[ctx.version]}
        self._no_cpu_id = not ctx.cpu_fault_has_cpu_id
        self._empty = {t: Records(np.empty(0, d), slice(0, 0), 0, None)
                       for t, d in self._dtypes.items()}
        self._open_batches = OpenBatches()

    # ---------------------------------------------------------------- public
    def set_processors(self, processors: Mapping[int, int]) -> None:
        """Add or change processor index -> trace GPU index entries (GPUs a process
        registered after the decoder was built); later records use them."""
        for k, v in processors.items():
            if 0 <= k < len(self._proc):
                self._proc[k] = v

    def feed(self, records: bytes | memoryview, clock: RawMap | int) -> dict[str, pa.Table]:
        """Tables (by name; only those with rows) of the records in `records`.

        clock: the CLOCK_MONOTONIC_RAW -> CLOCK_MONOTONIC map (`uvm_clock`), or one
        fixed offset CLOCK_MONOTONIC - CLOCK_MONOTONIC_RAW for every record.
        """
        buf = memoryview(records).cast("B")
        es = self.entry_size
        n = len(buf) // es
        if len(buf) % es:
            self.bad_records += 1
        if not n:
            return {}
        types = np.frombuffer(buf, np.uint8, n * es)[::es]
        counts = np.bincount(types, minlength=256)
        present = np.flatnonzero(counts).tolist()
        if len(present) == 1:  # one kind: the whole drain, no gather
            sels: dict[int, slice | npt.NDArray[np.intp]] = {present[0]: slice(0, n)}
        else:  # one stable sort groups the records by kind, queue order kept in each
            by_kind = np.argsort(types, kind="stable")
            sels, f0 = {}, 0
            for k in present:
                c = int(counts[k])
                sels[k] = by_kind[f0:f0 + c]
                f0 += c
        for k in present:
            c = int(counts[k])
            self.events[k] = self.events.get(k, 0) + c
            if k not in self._dtypes:
                self.bad_records += c

        def view(kind: int) -> Records:
            sel = sels.get(kind)
            dt = self._dtypes[kind]
            if sel is None:
                return self._empty[kind]
            m = sel.stop - sel.start if isinstance(sel, slice) else len(sel)
            return Records(np.frombuffer(buf, dt, n), sel, m,
                            "begin" if kind == MIGRATION else "ts")

        off = clock if isinstance(clock, RawMap) else RawMap.constant(int(clock))
        out: dict[str, list[pa.Table | None]] = {}
        cpu, gpu = view(CPU_FAULT), view(GPU_FAULT)
        out["faults"] = [self._cpu_faults(cpu, off), self._gpu_faults(gpu, off)]
        out["fault_batches"] = [self._batches(gpu, view(GPU_FAULT_REPLAY), off)]
        out["migrations"] = [self._migrations(view(MIGRATION), off)]
        if any(k in sels for k in _EVENT_KINDS):
            out["uvm_events"] = [self._events(view, off)]
        return _finish(out)

    def finish(self) -> dict[str, pa.Table]:
        """Flush batches whose replay was never seen (their duration is null)."""
        keys, first, count, dups = self._open_batches.flush()
        return _finish({"fault_batches": [self._batch_rows(
            keys, first, count, dups, np.ones(len(keys), bool), None)]})

    # ---------------------------------------------------------------- kinds
    def _gpu_of(self, idx: npt.NDArray[np.integer[Any]]) -> tuple[Any, Any]:
        g = self._proc[idx]
        null = g == _NO_GPU
        return g, null

    def _pid(self, n: int) -> Any:
        return const(self.ctx.pid, np.int32, n)

    def _cpu_faults(self, ev: Records, off: RawMap) -> pa.Table | None:
        n = len(ev)
        if not n:
            return None
        addr = ev["address"]
        return build_table("faults", n, {
            "ts_ns": off(ev["ts"]),
            "pid": self._pid(n),
            "tid": ev["tid"],
            "source_code": const(code("source", "cpu"), np.uint8, n),
            "address": addr, "block_2m": addr & ~np.uint64((2 << 20) - 1),
            "fault_type_code": const(255, np.uint8, n),
            "access_type_code": ACCESS_LUT[ev["access"]],
            "ip": ev["pc"], "cpu_id": (ev["cpu_id"], np.full(n, self._no_cpu_id)),
        })  # fmt: skip

    def _gpu_faults(self, ev: Records, off: RawMap) -> pa.Table | None:
        n = len(ev)
        if not n:
            return None
        g, null = self._gpu_of(ev["gpu"])
        self.unmapped_records += int(np.count_nonzero(null))
        ct = ev["client_type"]
        addr = ev["address"]
        return build_table("faults", n, {
            "ts_ns": off(ev["ts"]),
            "pid": self._pid(n),
            "source_code": SOURCE_LUT[ct], "gpu_index": (g, null),
            "address": addr, "block_2m": addr & ~np.uint64((2 << 20) - 1),
            "fault_type_code": FAULT_TYPE_LUT[ev["fault_type"]],
            "access_type_code": ACCESS_LUT[ev["access"]],
            "batch_id": ev["batch"], "ts_gpu_ns": ev["ts_gpu"],
            "gpc_id": (ev["gpc"], ct != CLIENT_GPC),
            "channel_id": (ev["gpc"], ct != CLIENT_HUB),
            "client_id": ev["client_id"],
        })  # fmt: skip

    def _batches(self, faults: Records, replays: Records, off: RawMap) -> pa.Table | None:
        if len(faults):
            self._open_batches.add(faults, off)
        if not len(replays):
            return None
        rkey = batch_key(replays)
        rkey, first = np.unique(rkey, return_index=True)  # a repeated replay closes once
        rts = off(replays["ts"][first])
        count, dups, fts, has = self._open_batches.close(rkey, rts)
        return self._batch_rows(rkey, fts, count, dups, has, (rts, replays["ts_gpu"][first]))

    def _batch_rows(self, rkey: Any, fts: Any, count: Any, dups: Any, has: Any,
                    replay: tuple[Any, Any] | None) -> pa.Table | None:
        """One row per batch key `rkey` (sorted): `has` says whether any of its faults
        were seen; `replay` (CPU time with the offset, GPU time) when it closed."""
        m = len(rkey)
        if not m:
            return None
        gpu_raw, ct, batch_id = split_key(rkey)
        g, null = self._gpu_of(gpu_raw)
        self.unmapped_records += int(np.count_nonzero(null))
        cols: dict[str, Col] = {
            "ts_ns": fts, "pid": self._pid(m), "gpu_index": (g, null),
            "batch_id": batch_id,
            "source_code": SOURCE_LUT[ct], "faults": (count, ~has),
            "duplicates": (dups, ~has),
        }
        if replay is not None:
            rts, rgpu = replay
            cols["duration_ns"] = (rts - fts, ~has)
            cols["replay_ts_gpu_ns"] = rgpu
        return build_table("fault_batches", m, cols)

    def _migrations(self, ev: Records, off: RawMap) -> pa.Table | None:
        if not len(ev):
            return None
        src, snull = self._gpu_of(ev["src"])
        dst, dnull = self._gpu_of(ev["dst"])
        bad = snull | dnull
        if bad.any():
            self.unmapped_records += int(np.count_nonzero(bad))
            ok = np.flatnonzero(~bad)
            ev, src, dst = ev.take(ok), src[ok], dst[ok]
        n = len(ev)
        if not n:
            return None
        begin, end = ev["begin"].view(np.int64), ev["end"].view(np.int64)
        bg, eg = ev["begin_gpu"], ev["end_gpu"]
        cols: dict[str, Col] = {
            "ts_ns": off(begin), "pid": self._pid(n),
            "src": src, "dst": dst, "address": ev["address"], "size_bytes": ev["bytes"],
            "cause_code": CAUSE_LUT[ev["cause"]],
            "duration_ns": (end - begin, end == 0),
            "ts_gpu_ns": (bg, bg == 0),
            "duration_gpu_ns": (eg.view(np.int64) - bg.view(np.int64), (bg == 0) | (eg == 0)),
        }
        if "src_nid" in ev.names:
            cols["src_nid"], cols["dst_nid"] = ev["src_nid"], ev["dst_nid"]
        return build_table("migrations", n, cols)

    def _mask_strings(self, mask: npt.NDArray[np.uint64]) -> Any:
        """Processor masks (n, words) as comma-joined trace GPU indices, CPU = -1."""
        n = len(mask)
        bits = np.unpackbits(np.ascontiguousarray(mask).view(np.uint8).reshape(n, -1),
                             axis=1, bitorder="little")
        row, idx = np.nonzero(bits)
        g = self._proc[idx]
        keep = g != _NO_GPU
        self.unmapped_records += int(np.unique(row[~keep]).size)
        row, g = row[keep], g[keep]
        order = np.lexsort((g, row))
        row, g = row[order], g[order]
        offsets = np.zeros(n + 1, np.int32)
        np.cumsum(np.bincount(row, minlength=n), out=offsets[1:])
        values: Any = pa.array(g).cast(pa.string())
        lists = pa.ListArray.from_arrays(offsets.tolist(), values)
        return pc.binary_join(lists, ",")

    def _events(self, view: Any, off: RawMap) -> pa.Table | None:
        parts: list[pa.Table] = []
        for kind in _EVENT_KINDS:
            ev = view(kind)
            n = len(ev)
            if not n:
                continue
            names = ev.names
            cols: dict[str, Col] = {
                "ts_ns": off(ev["ts"]),
                "pid": self._pid(n),
                "kind_code": np.full(n, kind, np.uint8), "address": ev["address"],
            }
            if "processor" in names:
                cols["processor"] = self._gpu_of(ev["processor"])
                self.unmapped_records += int(cols["processor"][1].sum())
            if "residency" in names:
                cols["residency"] = self._gpu_of(ev["residency"])
            if "size" in names:
                cols["size_bytes"] = ev["size"]
            if "mask" in names:
                cols["processors"] = self._mask_strings(ev["mask"].reshape(n, -1))
            if kind == FATAL_FAULT:
                cols["reason_code"] = FATAL_LUT[ev["reason"]]
                cols["fault_type_code"] = FAULT_TYPE_LUT[ev["fault_type"]]
                cols["access_type_code"] = ACCESS_LUT[ev["access"]]
            if kind == MAP_REMOTE:
                cols["reason_code"] = REMOTE_LUT[ev["cause"]]
                cols["ts_gpu_ns"] = (ev["ts_gpu"], ev["ts_gpu"] == 0)
            parts.append(build_table("uvm_events", n, cols))
        return pa.concat_tables(parts) if parts else None


_EVENT_KINDS = (FATAL_FAULT, READ_DUPLICATE, READ_DUPLICATE_INVALIDATE, THRASHING,
                THROTTLING_START, THROTTLING_END, MAP_REMOTE)


def _finish(out: Mapping[str, Sequence[pa.Table | None]]) -> dict[str, pa.Table]:
    res = {}
    for name, parts in out.items():
        ts = [p for p in parts if p is not None and p.num_rows]
        if ts:
            # each kind is in time order; kinds sharing a table (CPU and GPU faults,
            # the uvm_events kinds) follow each other
            res[name] = pa.concat_tables(ts) if len(ts) > 1 else ts[0]
    return res
