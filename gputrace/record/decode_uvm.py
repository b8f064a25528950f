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

from gputrace import schema
from gputrace.record.uvm_clock import RawMap

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


def _lut(mapping: Mapping[int, int], default: int, size: int = 256) -> npt.NDArray[np.uint8]:
    out = np.full(size, default, np.uint8)
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
_ENUM_BYTES = {k: [v[i].encode() if i in v else None for i in range(256)]
               for k, v in schema.ENUMS.items()}
_ENUM_LEN = {k: np.array([len(b or b"") for b in v], np.int32) for k, v in _ENUM_BYTES.items()}


def _code(enum: str, name: str) -> int:
    return next(k for k, v in schema.ENUMS[enum].items() if v == name)


# ----------------------------------------------------------------- table helpers
Col = Any
"""A column value for `_table`: a numpy array, (array, null mask), or a pyarrow array."""


_INT_TYPES: dict[Any, tuple[np.dtype[Any], int, int]] = {
    t: (np.dtype(d), int(np.iinfo(d).min), int(np.iinfo(d).max))
    for t, d in ((pa.int8(), np.int8), (pa.int16(), np.int16), (pa.int32(), np.int32),
                 (pa.int64(), np.int64), (pa.uint8(), np.uint8), (pa.uint16(), np.uint16),
                 (pa.uint32(), np.uint32), (pa.uint64(), np.uint64))}
"""Arrow integer type -> its numpy type and range."""


def _arrow(v: Col, typ: Any) -> Any:
    if isinstance(v, pa.Array | pa.ChunkedArray):
        return v if v.type == typ else v.cast(typ)
    null = None
    if isinstance(v, tuple):
        v, null = v
        nulls = int(np.count_nonzero(null))
        if nulls == len(null):
            return pa.nulls(len(null), typ)
        if not nulls:
            null = None
        else:  # values under a null do not count in the range check below
            v = np.where(null, 0, v)
    want = _INT_TYPES.get(typ)
    # narrowing in numpy where every value fits (an Arrow cast costs ~25 us a column);
    # otherwise Arrow's safe cast below raises as it always did
    if (want is not None and v.dtype != want[0] and len(v)
            and want[1] <= int(v.min()) and int(v.max()) <= want[2]):
        v = v.astype(want[0])
    arr = pa.array(np.ascontiguousarray(v), mask=null)
    return arr if arr.type == typ else arr.cast(typ)


_REPEATS: dict[tuple[Any, ...], Any] = {}


def _repeated(key: tuple[Any, ...], n: int, make: Any) -> Any:
    """`make(size)` (an Arrow array of one repeated value, or nulls) sliced to n rows:
    built once at a power-of-two size per key, then sliced (zero-copy)."""
    arr = _REPEATS.get(key)
    if arr is None or len(arr) < n:
        arr = _REPEATS[key] = make(max(1024, 1 << (n - 1).bit_length()))
    return arr.slice(0, n)


def _enum_strings(enum: str, codes: npt.NDArray[np.uint8]) -> Any:
    """The names of `codes` (null where a code has none) as a string array.

    Codes come in long runs (a drain's GPU faults share source and access type), so
    the array is built run by run from cached name bytes; many short runs use Arrow's
    take over the 256-entry name table instead."""
    n = len(codes)
    names = _ENUM_BYTES[enum]
    change = np.flatnonzero(codes[1:] != codes[:-1]) + 1
    starts = [0, *change.tolist()] if n and len(change) <= (n >> 5) + 16 else []
    run_codes = codes[starts].tolist()
    if not starts or any(names[c] is None for c in run_codes):
        idx: Any = pa.array(np.ascontiguousarray(codes))
        return _ENUM_NAMES[enum].take(idx)
    if len(starts) == 1:
        name = names[run_codes[0]] or b""
        return _repeated(("enum", enum, name), n, lambda size: _strings(
            np.arange(0, (size + 1) * len(name), len(name), dtype=np.int32), name * size))
    first = np.array(starts, np.intp)
    runs = np.append(first[1:], n) - first
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(np.repeat(_ENUM_LEN[enum][run_codes], runs), out=offsets[1:])
    return _strings(offsets, b"".join([(names[c] or b"") * m for c, m in zip(
        run_codes, runs.tolist(), strict=True)]))


def _const(value: int, dtype: type[np.integer[Any]], n: int) -> Any:
    """`value` n times (as an Arrow array)."""
    return _repeated(("const", value, dtype), n,
                     lambda size: pa.array(np.full(size, value, dtype)))


def _strings(offsets: npt.NDArray[np.int32], data: bytes) -> Any:
    return pa.Array.from_buffers(pa.string(), len(offsets) - 1,
                                 [None, pa.py_buffer(offsets.data), pa.py_buffer(data)])


_Plan = tuple[pa.Schema, tuple[tuple[str, pa.DataType, bool], ...]]
_PLANS: dict[str, _Plan] = {}


def _plan(name: str) -> _Plan:
    """A table's Arrow schema and (column, type, is an enum name) list, built once."""
    p = _PLANS.get(name)
    if p is None:
        t = schema.table(name)
        p = _PLANS[name] = (t.arrow_schema, tuple(
            (c.name, c.type, c.name in schema.ENUMS) for c in t.columns))
    return p


def _table(name: str, n: int, cols: Mapping[str, Col]) -> pa.Table:
    """A table of `name` from the given columns; enum names come from their codes, other
    columns not given are null."""
    arrow_schema, plan = _plan(name)
    arrays: list[Any] = []
    for cname, typ, enum in plan:
        v = cols.get(cname)
        if v is not None:
            arrays.append(_arrow(v, typ))
        elif enum and (code := cols.get(f"{cname}_code")) is not None:
            if isinstance(code, pa.Array):  # a `_const`
                code = code.to_numpy()
            arrays.append(_enum_strings(cname, code))  # codes are uint8 (the LUTs')
        else:
            arrays.append(_repeated(("null", typ), n, lambda size, t=typ: pa.nulls(size, t)))
    return pa.Table.from_arrays(arrays, schema=arrow_schema)


class _Records:
    """The records of one kind in one drain, in time order (queue order is nearly so):
    each field is gathered from the drain's bytes when first asked for."""

    __slots__ = ("_cache", "_full", "_sel", "n", "names")

    def __init__(self, full: npt.NDArray[np.void], sel: slice | npt.NDArray[np.intp],
                 n: int, ts_field: str | None) -> None:
        self._full, self._sel, self.n = full, sel, n
        self._cache: dict[str, npt.NDArray[Any]] = {}
        self.names: tuple[str, ...] = full.dtype.names or ()
        if ts_field is not None and n > 1:
            ts = self[ts_field]
            if bool(np.any(ts[1:] < ts[:-1])):
                order = np.argsort(ts, kind="stable")
                base = (np.arange(len(full))[sel] if isinstance(sel, slice) else sel)
                self._sel, self._cache = base[order], {}

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, field: str) -> npt.NDArray[Any]:
        v = self._cache.get(field)
        if v is None:
            v = self._cache[field] = self._full[field][self._sel]
        return v

    def take(self, idx: npt.NDArray[np.intp]) -> _Records:
        """The records at positions `idx` of this selection (fields re-gathered)."""
        sel = (np.arange(len(self._full))[self._sel] if isinstance(self._sel, slice)
               else self._sel)
        return _Records(self._full, sel[idx], len(idx), None)


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


_U8, _U40, _U32, _BYTE = np.uint64(8), np.uint64(40), np.uint64(32), np.uint64(0xFF)
_EMPTY_U64 = np.empty(0, np.uint64)
_COUNT, _DISTINCT, _FIRST, _PART = range(4)
"""Columns of the open batches' totals (`UvmStreamDecoder._open`)."""


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

    Open batches are kept as running totals per batch (faults, distinct
    address/access pairs, first fault time), so a drain costs the same however many
    batches are open. A batch's distinct pairs are kept too, in the part of the drain
    it last appeared in, and read back only when more of its faults arrive in a later
    drain (its duplicates may span drains).
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
        self._dtypes = {t: _DTYPES[(ctx.version, t)] for t in LAYOUTS[ctx.version]}
        self._no_cpu_id = not ctx.cpu_fault_has_cpu_id
        self._empty = {t: _Records(np.empty(0, d), slice(0, 0), 0, None)
                       for t, d in self._dtypes.items()}
        self._reset_open()

    def _reset_open(self) -> None:
        # open batches, sorted by key (gpu << 40 | client type << 32 | batch id), and per
        # batch a row of _OPEN_COLS: fault count, distinct (address, access) pairs, first
        # fault time, the id of the part holding its distinct pairs
        self._okey: npt.NDArray[np.uint64] = _EMPTY_U64
        self._open: npt.NDArray[np.int64] = np.empty((0, 4), np.int64)
        # part id -> [pair keys (key << 8 | access), addresses] sorted, open batches in it
        self._parts: dict[int, list[Any]] = {}
        self._next_part = 0

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

        def view(kind: int) -> _Records:
            sel = sels.get(kind)
            dt = self._dtypes[kind]
            if sel is None:
                return self._empty[kind]
            m = sel.stop - sel.start if isinstance(sel, slice) else len(sel)
            return _Records(np.frombuffer(buf, dt, n), sel, m,
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
        keys, o = self._okey, self._open
        self._reset_open()
        return _finish({"fault_batches": [self._batch_rows(
            keys, o[:, _FIRST], o[:, _COUNT], o[:, _COUNT] - o[:, _DISTINCT],
            np.ones(len(keys), bool), None)]})

    # ---------------------------------------------------------------- kinds
    def _gpu_of(self, idx: npt.NDArray[np.integer[Any]]) -> tuple[Any, Any]:
        g = self._proc[idx]
        null = g == _NO_GPU
        return g, null

    def _pid(self, n: int) -> Any:
        return _const(self.ctx.pid, np.int32, n)

    def _cpu_faults(self, ev: _Records, off: RawMap) -> pa.Table | None:
        n = len(ev)
        if not n:
            return None
        addr = ev["address"]
        return _table("faults", n, {
            "ts_ns": off(ev["ts"]),
            "pid": self._pid(n),
            "tid": ev["tid"],
            "source_code": _const(_code("source", "cpu"), np.uint8, n),
            "address": addr, "block_2m": addr & ~np.uint64((2 << 20) - 1),
            "fault_type_code": _const(255, np.uint8, n),
            "access_type_code": _ACCESS_LUT[ev["access"]],
            "ip": ev["pc"], "cpu_id": (ev["cpu_id"], np.full(n, self._no_cpu_id)),
        })  # fmt: skip

    def _gpu_faults(self, ev: _Records, off: RawMap) -> pa.Table | None:
        n = len(ev)
        if not n:
            return None
        g, null = self._gpu_of(ev["gpu"])
        self.unmapped_records += int(np.count_nonzero(null))
        ct = ev["client_type"]
        addr = ev["address"]
        return _table("faults", n, {
            "ts_ns": off(ev["ts"]),
            "pid": self._pid(n),
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
    def _key(ev: _Records) -> Any:
        return ((ev["gpu"].astype(np.uint64) << _U40)
                | (ev["client_type"].astype(np.uint64) << _U32)
                | ev["batch"].astype(np.uint64))

    def _batches(self, faults: _Records, replays: _Records, off: RawMap) -> pa.Table | None:
        if len(faults):
            self._add_faults(faults, off)
        if not len(replays):
            return None
        rkey = self._key(replays)
        rkey, first = np.unique(rkey, return_index=True)  # a repeated replay closes once
        rts = off(replays["ts"][first])
        okey = self._okey
        if len(okey):
            pos = np.minimum(np.searchsorted(okey, rkey), len(okey) - 1)
            has = okey[pos] == rkey
        else:
            pos, has = np.zeros(len(rkey), np.intp), np.zeros(len(rkey), bool)
        count = np.zeros(len(rkey), np.int64)
        dups = np.zeros(len(rkey), np.int64)
        fts = rts.copy()
        if has.any():
            p = pos[has]
            o = self._open[p]
            count[has] = o[:, _COUNT]
            dups[has] = o[:, _COUNT] - o[:, _DISTINCT]
            fts[has] = o[:, _FIRST]
            self._close(p)
        return self._batch_rows(rkey, fts, count, dups, has, (rts, replays["ts_gpu"][first]))

    def _add_faults(self, f: _Records, off: RawMap) -> None:
        """Fold a drain's GPU faults into the open batches' totals."""
        pair = (self._key(f) << _U8) | f["access"].astype(np.uint64)
        addr = f["address"]
        order = np.lexsort((addr, pair))
        pair, addr = pair[order], addr[order]
        n = len(pair)
        new_pair = np.empty(n, bool)  # first of its (key, access, address) in the drain
        new_pair[0] = True
        np.not_equal(pair[1:], pair[:-1], out=new_pair[1:])
        new_pair[1:] |= addr[1:] != addr[:-1]
        skey = pair >> _U8
        start = np.flatnonzero(skey[1:] != skey[:-1])
        start += 1
        start = np.concatenate(([0], start))
        add = np.empty((len(start), 4), np.int64)
        add[:-1, _COUNT] = start[1:] - start[:-1]
        add[-1, _COUNT] = n - start[-1]
        add[:, _DISTINCT] = np.add.reduceat(new_pair, start, dtype=np.int64)
        add[:, _FIRST] = np.minimum.reduceat(f["ts"].view(np.int64)[order], start)
        add[:, _FIRST] = off(add[:, _FIRST])
        add[:, _PART] = self._next_part
        keys = skey[start]
        pair, addr = pair[new_pair], addr[new_pair]
        self._next_part += 1
        okey, o = self._okey, self._open
        if not len(okey) or keys[0] > okey[-1]:  # the usual case: only new batches
            self._okey = np.concatenate((okey, keys))
            self._open = np.concatenate((o, add))
            self._parts[int(add[0, _PART])] = [pair, addr, len(keys)]
            return
        pos = np.searchsorted(okey, keys)
        known = okey[np.minimum(pos, len(okey) - 1)] == keys
        if known.any():  # batches already open: their pairs join this drain's
            p = pos[known]
            merged_pair, merged_addr, merged_distinct = self._merge_pairs(
                keys[known], p, pair, addr)
            was = o[p]
            was[:, _COUNT] += add[known, _COUNT]
            np.minimum(was[:, _FIRST], add[known, _FIRST], out=was[:, _FIRST])
            was[:, _DISTINCT] = merged_distinct
            self._release(was[:, _PART])
            was[:, _PART] = self._next_part
            o[p] = was
            self._parts[self._next_part] = [merged_pair, merged_addr, len(p)]
            self._next_part += 1
        new = ~known
        n_new = int(np.count_nonzero(new))
        if n_new:
            allk = np.concatenate((okey, keys[new]))
            order = np.argsort(allk, kind="stable")
            self._okey = allk[order]
            self._open = np.concatenate((o, add[new]))[order]
            self._parts[int(add[0, _PART])] = [pair, addr, n_new]

    def _merge_pairs(self, keys: npt.NDArray[np.uint64], pos: npt.NDArray[np.intp],
                     pair: npt.NDArray[np.uint64], addr: npt.NDArray[np.uint64]
                     ) -> tuple[Any, Any, Any]:
        """The distinct pairs of open batches `keys` (at `pos`) that got more faults:
        those kept from earlier drains and this drain's (`pair`/`addr`, sorted)."""
        ps, ads = [], []
        for k, part in zip(keys.tolist(), self._open[pos, _PART].tolist(), strict=True):
            lo_hi = np.array([k << 8, (k << 8) | 0xFF], np.uint64)
            for pp, aa in ((pair, addr), self._parts[part][:2]):
                lo, hi = int(np.searchsorted(pp, lo_hi[0], "left")), int(
                    np.searchsorted(pp, lo_hi[1], "right"))
                ps.append(pp[lo:hi])
                ads.append(aa[lo:hi])
        mp, ma = np.concatenate(ps), np.concatenate(ads)
        order = np.lexsort((ma, mp))
        mp, ma = mp[order], ma[order]
        keep = np.ones(len(mp), bool)
        np.not_equal(mp[1:], mp[:-1], out=keep[1:])
        keep[1:] |= ma[1:] != ma[:-1]
        mp, ma = mp[keep], ma[keep]
        start = np.searchsorted(mp >> _U8, keys)
        return mp, ma, np.append(start[1:], len(mp)) - start

    def _release(self, parts: npt.NDArray[np.int64]) -> None:
        """Open batches left the parts `parts` (one entry per batch)."""
        ids, n = np.unique(parts, return_counts=True)
        for i, c in zip(ids.tolist(), n.tolist(), strict=True):
            part = self._parts[i]
            part[2] -= c
            if part[2] <= 0:
                del self._parts[i]

    def _close(self, pos: npt.NDArray[np.intp]) -> None:
        """Forget the open batches at `pos` (their replay came)."""
        self._release(self._open[pos, _PART])
        keep = np.ones(len(self._okey), bool)
        keep[pos] = False
        self._okey, self._open = self._okey[keep], self._open[keep]

    def _batch_rows(self, rkey: Any, fts: Any, count: Any, dups: Any, has: Any,
                    replay: tuple[Any, Any] | None) -> pa.Table | None:
        """One row per batch key `rkey` (sorted): `has` says whether any of its faults
        were seen; `replay` (CPU time with the offset, GPU time) when it closed."""
        m = len(rkey)
        if not m:
            return None
        gpu_raw = (rkey >> _U40).astype(np.int64)
        ct = ((rkey >> _U32) & _BYTE).astype(np.int64)
        g, null = self._gpu_of(gpu_raw)
        self.unmapped_records += int(np.count_nonzero(null))
        cols: dict[str, Col] = {
            "ts_ns": fts, "pid": self._pid(m), "gpu_index": (g, null),
            "batch_id": (rkey & np.uint64(0xFFFFFFFF)).astype(np.uint32),
            "source_code": _SOURCE_LUT[ct], "faults": (count, ~has),
            "duplicates": (dups, ~has),
        }
        if replay is not None:
            rts, rgpu = replay
            cols["duration_ns"] = (rts - fts, ~has)
            cols["replay_ts_gpu_ns"] = rgpu
        return _table("fault_batches", m, cols)

    def _migrations(self, ev: _Records, off: RawMap) -> pa.Table | None:
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
            "cause_code": _CAUSE_LUT[ev["cause"]],
            "duration_ns": (end - begin, end == 0),
            "ts_gpu_ns": (bg, bg == 0),
            "duration_gpu_ns": (eg.view(np.int64) - bg.view(np.int64), (bg == 0) | (eg == 0)),
        }
        if "src_nid" in ev.names:
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
                cols["reason_code"] = _FATAL_LUT[ev["reason"]]
                cols["fault_type_code"] = _FAULT_TYPE_LUT[ev["fault_type"]]
                cols["access_type_code"] = _ACCESS_LUT[ev["access"]]
            if kind == MAP_REMOTE:
                cols["reason_code"] = _REMOTE_LUT[ev["cause"]]
                cols["ts_gpu_ns"] = (ev["ts_gpu"], ev["ts_gpu"] == 0)
            parts.append(_table("uvm_events", n, cols))
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
