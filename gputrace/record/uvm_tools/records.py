"""What the bytes of a UVM tools event queue mean: record kinds, their layouts per
ABI version (numpy dtypes), the tools ABI's enum codes mapped to the tables', and a
lazy per-kind view of one drain's records.

Record layouts are in docs/driver-facts.md §5.2 (`UvmEventEntry` 64 B and
`UvmEventEntry_V2` 72 B; byte 0 is the event type). The tools ABI numbers its
enums differently from the tables; `schema.TOOLS_*` maps them (the lookup tables
here apply that mapping to whole columns). Pure numpy: no root, no bcc.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from gputrace import schema

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


DTYPES = {(v, t): record_dtype(v, t) for v, kinds in LAYOUTS.items() for t in kinds}
"""(layout version, event type) -> record dtype, built once."""


def _lut(mapping: Mapping[int, int], default: int, size: int = 256) -> npt.NDArray[np.uint8]:
    """A 256-entry code -> code lookup table (`default` where `mapping` has no entry)."""
    out = np.full(size, default, np.uint8)
    for k, v in mapping.items():
        out[k] = v
    return out


FAULT_TYPE_LUT = _lut(schema.TOOLS_FAULT_TYPES, 255)
ACCESS_LUT = _lut(schema.TOOLS_ACCESS_TYPES, 255)
SOURCE_LUT = _lut(schema.TOOLS_CLIENT_TYPES, 0)
CAUSE_LUT = _lut(schema.TOOLS_MIGRATION_CAUSES, 0)
FATAL_LUT = _lut(schema.TOOLS_FATAL_REASONS, 0)
REMOTE_LUT = _lut(schema.TOOLS_MAP_REMOTE_CAUSES, 0)


def code(enum: str, name: str) -> int:
    """The code of `name` in the schema enumeration `enum`."""
    return next(k for k, v in schema.ENUMS[enum].items() if v == name)


class Records:
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

    def take(self, idx: npt.NDArray[np.intp]) -> Records:
        """The records at positions `idx` of this selection (fields re-gathered)."""
        sel = (np.arange(len(self._full))[self._sel] if isinstance(self._sel, slice)
               else self._sel)
        return Records(self._full, sel[idx], len(idx), None)
