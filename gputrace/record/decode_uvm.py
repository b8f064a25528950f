"""Decode the UVM tools event queue (and counters, and RM memory samples) into table rows.

The recorder drains each process's UVM tools queue as raw bytes; this module
turns those bytes into Arrow tables in bulk: one numpy structured view over
the whole buffer per record kind, never one Python object per event. Pure
numpy/pyarrow: it needs neither root nor bcc, so it runs on recorded bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa


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
    """One RM FB_GET_INFO_V2 answer for one GPU (a `gpu_memory` row)."""

    ts_ns: int
    gpu_index: int
    status: int
    heap_size_bytes: int | None = None
    heap_free_bytes: int | None = None
    largest_free_bytes: int | None = None
    largest_free_base_bytes: int | None = None


class UvmStreamDecoder:
    """Decodes successive drains of one tools queue; keeps fault batches open across drains."""

    def __init__(self, ctx: UvmStreamContext) -> None:
        self.ctx = ctx
        self.bad_records = 0

    def feed(self, records: bytes | memoryview, clock_offset_ns: int) -> dict[str, pa.Table]:
        """Tables (by name) of the records in `records`.

        clock_offset_ns = CLOCK_MONOTONIC - CLOCK_MONOTONIC_RAW measured near this drain.
        """
        raise NotImplementedError

    def finish(self) -> dict[str, pa.Table]:
        """Flush batches whose replay was never seen."""
        raise NotImplementedError


def counters_table(ts_ns: int, pid: int, counters: Sequence[int]) -> pa.Table:
    """`uvm_counters` rows of one sample of a counter tracker's array."""
    raise NotImplementedError


def gpu_memory_table(rows: Sequence[GpuMemorySample]) -> pa.Table:
    """`gpu_memory` rows of RM samples."""
    raise NotImplementedError
