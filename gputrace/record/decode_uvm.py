"""Decode the UVM tools event queue (and counters, and RM memory samples) into table rows.

The recorder drains each process's UVM tools queue as raw bytes; this module
turns those bytes into Arrow tables in bulk: one numpy structured view over
the whole buffer per record kind, never one Python object per event. Pure
numpy/pyarrow: it needs neither root nor bcc, so it runs on recorded bytes.

Record layouts are in nvidia-driver-facts.md §5.2 (`UvmEventEntry` 64 B and
`UvmEventEntry_V2` 72 B; byte 0 is the event type). The tools ABI numbers its
enums differently from the tables; `schema.TOOLS_*` maps them. Processor
indices in the records are tools indices (the CPU is 0), mapped to trace GPU
indices (the CPU is -1) through `UvmStreamContext.processors`.

CPU timestamps in the records are CLOCK_MONOTONIC_RAW; the recorder measures
CLOCK_MONOTONIC - CLOCK_MONOTONIC_RAW near each drain and passes it in. GPU
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

from gputrace import schema

# ------------------------------------------------------------------ event types
CPU_FAULT, MIGRATION, GPU_FAULT, GPU_FAULT_REPLAY = 1, 2, 3, 4
FATAL_FAULT, READ_DUPLICATE, READ_DUPLICATE_INVALIDATE = 6, 7, 8
THRASHING, THROTTLING_START, THROTTLING_END, MAP_REMOTE = 10, 11, 12, 13
EVENT_NAMES: dict[int, str] = {
    1: "cpu_fault", 2: "migration", 3: "gpu_fault", 4: "gpu_fault_replay",
    5: "fault_buffer_overflow", 6: "fatal_fault", 7: "read_duplicate",
    8: "read_duplicate_invalidate", 9: "page_size_change", 10: "thrashing_detected",
    11: "throttling_start", 12: "throttling_end", 13: "map_remote", 14: "eviction",
}  # fmt: skip
"""UvmEventType -> the name used in manifest drop keys (`uvm_tools:<name>`)."""

ENTRY_SIZE = {1: 64, 2: 72}
CLIENT_GPC, CLIENT_HUB = 1, 2
MASK_WORDS = {1: 1, 2: 5}
"""u64 words of a processor mask: V1 one u64 (33 processors), V2 UVM_PROCESSOR_MASK_SIZE
(257 processors -> 5)."""

Field = tuple[str, int, str]
# One table per layout version: event type -> (field, byte offset, numpy type).
# Offsets from uvm_types.h (595.45.04; V1 CPU/GPU fault and migration byte-identical
# to 535). `cpu_id` of CPU faults is padding before 565.57.01.
LAYOUTS: dict[int, dict[int, tuple[Field, ...]]] = {
    1: {
        CPU_FAULT: (("access", 1, "u1"), ("cpu_id", 4, "<u4"), ("address", 8, "<u8"),
                    ("ts", 16, "<u8"), ("pid", 24, "<u4"), ("tid", 28, "<u4"),
                    ("pc", 32, "<u8")),
        MIGRATION: (("cause", 1, "u1"), ("src", 2, "u1"), ("dst", 3, "u1"),
                    ("address", 8, "<u8"), ("bytes", 16, "<u8"), ("begin", 24, "<u8"),
                    ("end", 32, "<u8"), ("range_group", 40, "<u8"),
                    ("begin_gpu", 48, "<u8"), ("end_gpu", 56, "<u8")),
        GPU_FAULT: (("fault_type", 1, "u1"), ("access", 2, "u1"), ("gpu", 3, "u1"),
                    ("gpc", 4, "<u2"), ("client_id", 6, "<u2"), ("address", 8, "<u8"),
                    ("ts", 16, "<u8"), ("ts_gpu", 24, "<u8"), ("batch", 32, "<u4"),
                    ("client_type", 36, "u1")),
        GPU_FAULT_REPLAY: (("gpu", 1, "u1"), ("client_type", 2, "u1"), ("batch", 4, "<u4"),
                           ("ts", 8, "<u8"), ("ts_gpu", 16, "<u8")),
        FATAL_FAULT: (("fault_type", 1, "u1"), ("access", 2, "u1"), ("processor", 3, "u1"),
                      ("reason", 4, "u1"), ("address", 8, "<u8"), ("ts", 16, "<u8")),
        READ_DUPLICATE: (("mask", 8, "(1,)<u8"), ("address", 16, "<u8"), ("size", 24, "<u8"),
                         ("ts", 32, "<u8")),
        READ_DUPLICATE_INVALIDATE: (("processor", 1, "u1"), ("address", 8, "<u8"),
                                    ("size", 16, "<u8"), ("ts", 24, "<u8")),
        THRASHING: (("mask", 8, "(1,)<u8"), ("address", 16, "<u8"), ("size", 24, "<u8"),
                    ("ts", 32, "<u8")),
        THROTTLING_START: (("processor", 1, "u1"), ("address", 8, "<u8"), ("ts", 16, "<u8")),
        THROTTLING_END: (("processor", 1, "u1"), ("address", 8, "<u8"), ("ts", 16, "<u8")),
        MAP_REMOTE: (("processor", 1, "u1"), ("residency", 2, "u1"), ("cause", 3, "u1"),
                     ("address", 8, "<u8"), ("size", 16, "<u8"), ("ts", 24, "<u8"),
                     ("ts_gpu", 32, "<u8")),
    },
    2: {
        CPU_FAULT: (("access", 1, "u1"), ("cpu_id", 4, "<u4"), ("address", 8, "<u8"),
                    ("ts", 16, "<u8"), ("pid", 24, "<u4"), ("tid", 28, "<u4"),
                    ("pc", 32, "<u8")),
        MIGRATION: (("cause", 1, "u1"), ("src", 4, "<u2"), ("dst", 6, "<u2"),
                    ("src_nid", 8, "<i4"), ("dst_nid", 12, "<i4"), ("address", 16, "<u8"),
                    ("bytes", 24, "<u8"), ("begin", 32, "<u8"), ("end", 40, "<u8"),
                    ("range_group", 48, "<u8"), ("begin_gpu", 56, "<u8"),
                    ("end_gpu", 64, "<u8")),
        GPU_FAULT: (("fault_type", 1, "u1"), ("gpu", 2, "<u2"), ("gpc", 4, "<u2"),
                    ("client_id", 6, "<u2"), ("address", 8, "<u8"), ("ts", 16, "<u8"),
                    ("ts_gpu", 24, "<u8"), ("batch", 32, "<u4"), ("client_type", 36, "u1"),
                    ("access", 37, "u1")),
        GPU_FAULT_REPLAY: (("client_type", 1, "u1"), ("gpu", 2, "<u2"), ("batch", 4, "<u4"),
                           ("ts", 8, "<u8"), ("ts_gpu", 16, "<u8")),
        FATAL_FAULT: (("fault_type", 1, "u1"), ("access", 2, "u1"), ("reason", 3, "u1"),
                      ("processor", 4, "<u2"), ("address", 8, "<u8"), ("ts", 16, "<u8")),
        READ_DUPLICATE: (("address", 8, "<u8"), ("size", 16, "<u8"), ("ts", 24, "<u8"),
                         ("mask", 32, "(5,)<u8")),
        READ_DUPLICATE_INVALIDATE: (("processor", 2, "<u2"), ("address", 8, "<u8"),
                                    ("size", 16, "<u8"), ("ts", 24, "<u8")),
        THRASHING: (("address", 8, "<u8"), ("size", 16, "<u8"), ("ts", 24, "<u8"),
                    ("mask", 32, "(5,)<u8")),
        THROTTLING_START: (("processor", 2, "<u2"), ("address", 8, "<u8"), ("ts", 16, "<u8")),
        THROTTLING_END: (("processor", 2, "<u2"), ("address", 8, "<u8"), ("ts", 16, "<u8")),
        MAP_REMOTE: (("cause", 1, "u1"), ("processor", 4, "<u2"), ("residency", 6, "<u2"),
                     ("address", 8, "<u8"), ("size", 16, "<u8"), ("ts", 24, "<u8"),
                     ("ts_gpu", 32, "<u8")),
    },
}


def record_dtype(version: int, event_type: int) -> np.dtype[Any]:
    """The numpy view of one record kind in one layout version (itemsize = entry size)."""
    fields = LAYOUTS[version][event_type]
    return np.dtype({"names": [f[0] for f in fields], "formats": [f[2] for f in fields],
                     "offsets": [f[1] for f in fields], "itemsize": ENTRY_SIZE[version]})


_DTYPES = {(v, t): record_dtype(v, t) for v, kinds in LAYOUTS.items() for t in kinds}
_NO_GPU = np.int32(-(1 << 20))
"""Lookup value of a processor index missing from the context's table."""


def _lut(mapping: Mapping[int, int], default: int, size: int = 256) -> npt.NDArray[np.int32]:
    out = np.full(size, default, np.int32)
    for k, v in mapping.items():
        out[k] = v
    return out


_FAULT_TYPE_LUT = _lut(schema.TOOLS_FAULT_TYPES, 255)
_ACCESS_LUT = _lut(schema.TOOLS_ACCESS_TYPES, 255)
_SOURCE_LUT = _lut(schema.TOOLS_CLIENT_TYPES, 0)
_CAUSE_LUT = _lut(schema.TOOLS_MIGRATION_CAUSES, 0)
_FATAL_LUT = _lut(schema.TOOLS_FATAL_REASONS, 0)
_REMOTE_LUT = _lut(schema.TOOLS_MAP_REMOTE_CAUSES, 0)
_ENUM_NAMES = {k: pa.array([v.get(i) for i in range(256)], pa.string())
               for k, v in schema.ENUMS.items()}


def _code(enum: str, name: str) -> int:
    return next(k for k, v in schema.ENUMS[enum].items() if v == name)


# ----------------------------------------------------------------- table helpers
Col = Any
"""A column value for `_table`: a numpy array, (array, null mask), or a pyarrow array."""


def _arrow(v: Col, typ: pa.DataType) -> Any:
    if isinstance(v, pa.Array | pa.ChunkedArray):
        return v.cast(typ)
    if isinstance(v, tuple):
        data, null = v
        return pa.array(np.ascontiguousarray(data), mask=null).cast(typ)
    return pa.array(np.ascontiguousarray(v)).cast(typ)


def _table(name: str, n: int, cols: Mapping[str, Col]) -> pa.Table:
    """A table of `name` from the given columns; enum names come from their codes, other
    columns not given are null."""
    t = schema.table(name)
    arrays: list[Any] = []
    for c in t.columns:
        if c.name in cols:
            arrays.append(_arrow(cols[c.name], c.type))
        elif c.name in schema.ENUMS and f"{c.name}_code" in cols:
            codes = _arrow(cols[f"{c.name}_code"], pa.uint8())
            arrays.append(_ENUM_NAMES[c.name].take(codes))
        else:
            typ: Any = c.type
            arrays.append(pa.nulls(n, typ))
    return pa.Table.from_arrays(arrays, schema=t.arrow_schema)


# ------------------------------------------------------------------- the decoder
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


@dataclass(frozen=True)
class GpuMemorySample:
    """One RM FB_GET_INFO_V2 answer for one GPU (a `gpu_memory` row); sizes in bytes,
    None when the query failed (status != 0)."""

    ts_ns: int
    gpu_index: int
    status: int
    heap_size_bytes: int | None = None
    heap_free_bytes: int | None = None
    largest_free_bytes: int | None = None
    largest_free_base_bytes: int | None = None


_PENDING = np.dtype([("key", "<u8"), ("ts", "<i8"), ("address", "<u8"), ("access", "u1")])
"""A fault whose batch is still open: key = gpu << 40 | client type << 32 | batch id."""


class UvmStreamDecoder:
    """Decodes successive drains of one tools queue into `faults`, `fault_batches`,
    `migrations` and `uvm_events` tables.

    A fault batch closes at its replay event; faults of batches still open at the
    end of a drain wait for later drains (`finish` flushes them without a replay).
    Records that cannot be decoded (unknown or invalid type, a truncated tail) are
    counted in `bad_records`; rows naming a processor index missing from the
    context's table get a null GPU, or are dropped where the column cannot be null
    (migrations), and are counted in `unmapped_records`. `events` tallies every
    record by type.
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
        self._pending = np.empty(0, _PENDING)

    # ---------------------------------------------------------------- public
    def set_processors(self, processors: Mapping[int, int]) -> None:
        """Add or change processor index -> trace GPU index entries (GPUs a process
        registered after the decoder was built); later records use them."""
        for k, v in processors.items():
            if 0 <= k < len(self._proc):
                self._proc[k] = v

    def feed(self, records: bytes | memoryview, clock_offset_ns: int) -> dict[str, pa.Table]:
        """Tables (by name; only those with rows) of the records in `records`.

        clock_offset_ns = CLOCK_MONOTONIC - CLOCK_MONOTONIC_RAW measured near this drain.
        """
        buf = memoryview(records).cast("B")
        n = len(buf) // self.entry_size
        if len(buf) % self.entry_size:
            self.bad_records += 1
        raw = np.frombuffer(buf, np.uint8, n * self.entry_size)
        types = np.ascontiguousarray(raw[:: self.entry_size]) if n else np.empty(0, np.uint8)
        # one stable sort groups the records by kind, queue order kept within each
        by_kind = np.argsort(types, kind="stable")
        kinds, first, counts = np.unique(types[by_kind], return_index=True,
                                         return_counts=True)
        where = {}
        for k, f0, c in zip(kinds.tolist(), first.tolist(), counts.tolist(), strict=True):
            self.events[k] = self.events.get(k, 0) + c
            where[k] = by_kind[f0:f0 + c]
            if k not in LAYOUTS[self.ctx.version]:
                self.bad_records += c

        def view(kind: int) -> npt.NDArray[np.void]:
            """The records of one kind, in time order (queue order is nearly so)."""
            sel = where.get(kind)
            if sel is None:
                return np.empty(0, _DTYPES[(self.ctx.version, kind)])
            ev = np.frombuffer(buf, _DTYPES[(self.ctx.version, kind)], n)[sel]
            ts = ev["begin"] if kind == MIGRATION else ev["ts"]
            if len(ts) > 1 and bool(np.any(ts[1:] < ts[:-1])):
                ev = ev[np.argsort(ts, kind="stable")]
            return ev

        off = int(clock_offset_ns)
        out: dict[str, list[pa.Table | None]] = {}
        cpu, gpu = view(CPU_FAULT), view(GPU_FAULT)
        out["faults"] = [self._cpu_faults(cpu, off), self._gpu_faults(gpu, off)]
        out["fault_batches"] = [self._batches(gpu, view(GPU_FAULT_REPLAY), off)]
        out["migrations"] = [self._migrations(view(MIGRATION), off)]
        out["uvm_events"] = [self._events(view, off)]
        return _finish(out)

    def finish(self) -> dict[str, pa.Table]:
        """Flush batches whose replay was never seen (their duration is null)."""
        p, self._pending = self._pending, np.empty(0, _PENDING)
        return _finish({"fault_batches": [self._batch_rows(p, None)]})

    # ---------------------------------------------------------------- kinds
    def _gpu_of(self, idx: npt.NDArray[np.integer[Any]]) -> tuple[Any, Any]:
        g = self._proc[idx.astype(np.int64)]
        null = g == _NO_GPU
        return g, null

    def _cpu_faults(self, ev: npt.NDArray[np.void], off: int) -> pa.Table | None:
        n = len(ev)
        if not n:
            return None
        addr = ev["address"]
        no_cpu = np.full(n, not self.ctx.cpu_fault_has_cpu_id)
        return _table("faults", n, {
            "ts_ns": ev["ts"].astype(np.int64) + off,
            "pid": np.full(n, self.ctx.pid, np.int32),
            "tid": ev["tid"],
            "source_code": np.full(n, _code("source", "cpu"), np.uint8),
            "address": addr, "block_2m": addr & ~np.uint64((2 << 20) - 1),
            "fault_type_code": np.full(n, 255, np.uint8),
            "access_type_code": _ACCESS_LUT[ev["access"]],
            "ip": ev["pc"], "cpu_id": (ev["cpu_id"], no_cpu),
        })  # fmt: skip

    def _gpu_faults(self, ev: npt.NDArray[np.void], off: int) -> pa.Table | None:
        n = len(ev)
        if not n:
            return None
        g, null = self._gpu_of(ev["gpu"])
        self.unmapped_records += int(null.sum())
        ct = ev["client_type"]
        addr = ev["address"]
        return _table("faults", n, {
            "ts_ns": ev["ts"].astype(np.int64) + off,
            "pid": np.full(n, self.ctx.pid, np.int32),
            "source_code": _SOURCE_LUT[ct], "gpu_index": (g, null),
            "address": addr, "block_2m": addr & ~np.uint64((2 << 20) - 1),
            "fault_type_code": _FAULT_TYPE_LUT[ev["fault_type"]],
            "access_type_code": _ACCESS_LUT[ev["access"]],
            "batch_id": ev["batch"], "ts_gpu_ns": ev["ts_gpu"],
            "gpc_id": (ev["gpc"], ct != CLIENT_GPC),
            "channel_id": (ev["gpc"], ct != CLIENT_HUB),
            "client_id": ev["client_id"],
        })  # fmt: skip

    @staticmethod
    def _key(ev: npt.NDArray[np.void]) -> Any:
        return ((ev["gpu"].astype(np.uint64) << np.uint64(40))
                | (ev["client_type"].astype(np.uint64) << np.uint64(32))
                | ev["batch"].astype(np.uint64))

    def _batches(self, faults: npt.NDArray[np.void], replays: npt.NDArray[np.void],
                 off: int) -> pa.Table | None:
        new = np.empty(len(faults), _PENDING)
        new["key"] = self._key(faults)
        new["ts"] = faults["ts"].astype(np.int64) + off
        new["address"] = faults["address"]
        new["access"] = faults["access"]
        allf = np.concatenate([self._pending, new]) if len(self._pending) else new
        if not len(replays):
            self._pending = allf
            return None
        rkey = self._key(replays)
        rkey, first = np.unique(rkey, return_index=True)  # a repeated replay closes once
        closed = np.isin(allf["key"], rkey)
        self._pending = allf[~closed]
        r = replays[first]
        rts = r["ts"].astype(np.int64) + off
        return self._batch_rows(allf[closed], (rkey, rts, r["ts_gpu"]))

    def _batch_rows(self, f: npt.NDArray[np.void],
                    replay: tuple[Any, Any, Any] | None) -> pa.Table | None:
        """One row per batch: the faults `f` grouped by key, joined to their replays."""
        order = np.lexsort((f["access"], f["address"], f["key"]))
        f = f[order]
        keys, start, count = np.unique(f["key"], return_index=True, return_counts=True)
        same = np.zeros(len(f), bool)
        if len(f) > 1:
            same[1:] = ((f["key"][1:] == f["key"][:-1]) & (f["address"][1:] == f["address"][:-1])
                        & (f["access"][1:] == f["access"][:-1]))
        dups = np.add.reduceat(same.astype(np.int64), start) if len(f) else np.zeros(0, np.int64)
        first_ts = (np.minimum.reduceat(f["ts"], start) if len(f)
                    else np.zeros(0, np.int64))
        if replay is None:
            rkey, rts, rgpu = keys, None, None
            nf, nd, fts = count, dups, first_ts
            has = np.ones(len(keys), bool)
        else:
            rkey, rts, rgpu = replay
            if len(keys):
                pos = np.minimum(np.searchsorted(keys, rkey), len(keys) - 1)
                has = keys[pos] == rkey
            else:
                pos, has = np.zeros(len(rkey), np.intp), np.zeros(len(rkey), bool)
                count = dups = first_ts = np.zeros(1, np.int64)
            nf, nd = np.where(has, count[pos], 0), np.where(has, dups[pos], 0)
            fts = np.where(has, first_ts[pos], rts)
        m = len(rkey)
        if not m:
            return None
        gpu_raw = (rkey >> np.uint64(40)).astype(np.int64)
        ct = ((rkey >> np.uint64(32)) & np.uint64(0xFF)).astype(np.int64)
        g, null = self._gpu_of(gpu_raw)
        self.unmapped_records += int(null.sum())
        cols: dict[str, Col] = {
            "ts_ns": fts, "pid": np.full(m, self.ctx.pid, np.int32), "gpu_index": (g, null),
            "batch_id": (rkey & np.uint64(0xFFFFFFFF)).astype(np.uint32),
            "source_code": _SOURCE_LUT[ct], "faults": (nf, ~has), "duplicates": (nd, ~has),
        }
        if rts is not None:
            cols["duration_ns"] = (rts - fts, ~has)
            cols["replay_ts_gpu_ns"] = rgpu
        return _table("fault_batches", m, cols)

    def _migrations(self, ev: npt.NDArray[np.void], off: int) -> pa.Table | None:
        if not len(ev):
            return None
        src, snull = self._gpu_of(ev["src"])
        dst, dnull = self._gpu_of(ev["dst"])
        ok = ~(snull | dnull)
        self.unmapped_records += int((~ok).sum())
        ev, src, dst = ev[ok], src[ok], dst[ok]
        n = len(ev)
        if not n:
            return None
        begin, end = ev["begin"].astype(np.int64), ev["end"].astype(np.int64)
        bg, eg = ev["begin_gpu"], ev["end_gpu"]
        cols: dict[str, Col] = {
            "ts_ns": begin + off, "pid": np.full(n, self.ctx.pid, np.int32),
            "src": src, "dst": dst, "address": ev["address"], "size_bytes": ev["bytes"],
            "cause_code": _CAUSE_LUT[ev["cause"]],
            "duration_ns": (end - begin, end == 0),
            "ts_gpu_ns": (bg, bg == 0),
            "duration_gpu_ns": (eg.astype(np.int64) - bg.astype(np.int64), (bg == 0) | (eg == 0)),
        }
        if "src_nid" in (ev.dtype.names or ()):
            cols["src_nid"], cols["dst_nid"] = ev["src_nid"], ev["dst_nid"]
        return _table("migrations", n, cols)

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

    def _events(self, view: Any, off: int) -> pa.Table | None:
        parts: list[pa.Table] = []
        for kind in (FATAL_FAULT, READ_DUPLICATE, READ_DUPLICATE_INVALIDATE, THRASHING,
                     THROTTLING_START, THROTTLING_END, MAP_REMOTE):
            ev = view(kind)
            n = len(ev)
            if not n:
                continue
            names = ev.dtype.names or ()
            cols: dict[str, Col] = {
                "ts_ns": ev["ts"].astype(np.int64) + off,
                "pid": np.full(n, self.ctx.pid, np.int32),
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
                cols["reason_code"] = _FATAL_LUT[ev["reason"]]
                cols["fault_type_code"] = _FAULT_TYPE_LUT[ev["fault_type"]]
                cols["access_type_code"] = _ACCESS_LUT[ev["access"]]
            if kind == MAP_REMOTE:
                cols["reason_code"] = _REMOTE_LUT[ev["cause"]]
                cols["ts_gpu_ns"] = (ev["ts_gpu"], ev["ts_gpu"] == 0)
            parts.append(_table("uvm_events", n, cols))
        return pa.concat_tables(parts) if parts else None


def _finish(out: Mapping[str, Sequence[pa.Table | None]]) -> dict[str, pa.Table]:
    res = {}
    for name, parts in out.items():
        ts = [p for p in parts if p is not None and p.num_rows]
        if ts:
            # each kind is in time order; kinds sharing a table (CPU and GPU faults,
            # the uvm_events kinds) follow each other
            res[name] = pa.concat_tables(ts) if len(ts) > 1 else ts[0]
    return res


def counters_table(ts_ns: int, pid: int, counters: Sequence[int]) -> pa.Table:
    """`uvm_counters` rows of one sample of a counter tracker's array (indexed by
    UvmCounterName; the Windows-only 3-6 are skipped)."""
    codes = [c for c in schema.UVM_COUNTERS if c < len(counters)]
    n = len(codes)
    return _table("uvm_counters", n, {
        "ts_ns": np.full(n, ts_ns, np.int64), "pid": np.full(n, pid, np.int32),
        "counter_code": np.array(codes, np.uint8),
        "value": np.array([int(counters[c]) for c in codes], np.uint64),
    })  # fmt: skip


def gpu_memory_table(rows: Sequence[GpuMemorySample]) -> pa.Table:
    """`gpu_memory` rows of RM samples (sizes null where the query failed)."""
    t = schema.table("gpu_memory")
    data = {c.name: [getattr(r, c.name) for r in rows] for c in t.columns}
    for r, i in zip(rows, range(len(rows)), strict=True):
        if r.status != 0:
            for k in ("heap_size_bytes", "heap_free_bytes", "largest_free_bytes",
                      "largest_free_base_bytes"):
                data[k][i] = None
    return pa.Table.from_pydict(data, schema=t.arrow_schema)
