"""Rows of the driver layer's periodic samples: `uvm_counters` (a UVM tools counter
tracker's array) `gpu_memory` (our RM client's FB_GET_INFO_V2 answers) and `gpu_process_memory` (its
GET_PIDS/GET_PID_INFO answers).

Pure numpy/pyarrow, like the event decoder (`decode_uvm`) beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from gputrace import schema
from gputrace.record.arrow_columns import build_table


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
    trigger: str = "tick"
    delay_ns: int | None = None


@dataclass(frozen=True)
class GpuProcessMemorySample:
    """One process's video memory on one GPU from RM's GET_PID_INFO (a
    `gpu_process_memory` row); bytes None when the query failed (status != 0)."""

    ts_ns: int
    gpu_index: int
    pid: int
    status: int
    vidmem_bytes: int | None = None
    trigger: str = "tick"

def counters_table(ts_ns: int, pid: int, counters: Sequence[int]) -> pa.Table:
    """`uvm_counters` rows of one sample of a counter tracker's array (indexed by
    UvmCounterName; the Windows-only 3-6 are skipped)."""
    codes = [c for c in schema.UVM_COUNTERS if c < len(counters)]
    n = len(codes)
    return build_table("uvm_counters", n, {
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


def gpu_process_memory_table(rows: Sequence[GpuProcessMemorySample]) -> pa.Table:
    """`gpu_process_memory` rows of RM per-process samples (bytes null where the query
    failed)."""
    t = schema.table("gpu_process_memory")
    data = {c.name: [getattr(r, c.name) for r in rows] for c in t.columns}
    data["vidmem_bytes"] = [r.vidmem_bytes if r.status == 0 else None for r in rows]
    return pa.Table.from_pydict(data, schema=t.arrow_schema)
