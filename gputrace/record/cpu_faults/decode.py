"""Numpy mirrors and bulk decoding for CPU faults on managed memory (fault_event
and the managed-range maps in probes/gputrace_events.h) into `faults` batches."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from gputrace import schema
from gputrace.record.decode import _batch, _by_time, _strings_from, _who, batched, records
from gputrace.record.structs import mirror

# ---------------------------------------------------- CPU faults on managed memory
FAULT_DTYPE = np.dtype(
    [
        ("ts_ns", "<u8"), ("address", "<u8"), ("ip", "<u8"), ("pid", "<u4"), ("tid", "<u4"),
        ("error_code", "<u4"), ("_pad0", "<u4"), ("comm", "S16"),
    ]
)  # fmt: skip
mirror("gputrace_events.h", "fault_event", FAULT_DTYPE)
FAULT_STAGE_EVENTS = 64  # GT_FAULT_STAGE
MBLOCK_KEY_DTYPE = np.dtype([("tgid", "<u4"), ("gen", "<u4"), ("block", "<u8")])
mirror("gputrace_events.h", "mblock_key", MBLOCK_KEY_DTYPE)
MBLOCK_DTYPE = np.dtype([("bits", "<u8", (8,))])
mirror("gputrace_events.h", "mblock", MBLOCK_DTYPE)
BIG_RANGES = 16  # GT_BIG_RANGES
MANAGED_PROC_DTYPE = np.dtype(
    [("gen", "<u4"), ("nblocks", "<u4"), ("big_start", "<u8", (BIG_RANGES,)),
     ("big_end", "<u8", (BIG_RANGES,))]
)  # fmt: skip
mirror("gputrace_events.h", "managed_proc", MANAGED_PROC_DTYPE)
PF_WRITE = 1 << 1  # x86 page-fault error code: the access was a write
SOURCE_CPU, FAULT_TYPE_UNKNOWN, ACCESS_READ, ACCESS_WRITE = 1, 255, 1, 2


def fault_events(bodies: bytes) -> npt.NDArray[np.void]:
    """Faults from concatenated batch bodies (the records with their 8-byte header cut)."""
    return records(bodies, FAULT_DTYPE)[0]


def fault_events_from_batches(raw: bytes) -> npt.NDArray[np.void]:
    """Faults from concatenated `struct fault_batch` records (each count-prefixed)."""
    return batched(raw, FAULT_DTYPE, FAULT_STAGE_EVENTS)[0]


def faults_batch(ev: npt.NDArray[np.void]) -> pa.RecordBatch:
    """CPU faults as a record batch of the `faults` table (source cpu, fault type unknown,
    read/write from bit 1 of the error code, block_2m = address rounded down to 2 MiB)."""
    ev = _by_time(ev)
    n = len(ev)
    addr = np.ascontiguousarray(ev["address"])
    access = np.where((ev["error_code"] & PF_WRITE) != 0, ACCESS_WRITE, ACCESS_READ)
    access = access.astype(np.uint8)
    source = np.full(n, SOURCE_CPU, np.uint8)
    ftype = np.full(n, FAULT_TYPE_UNKNOWN, np.uint8)
    cols: dict[str, Any] = {
        **_who(ev),
        "source_code": pa.array(source),
        "source": _strings_from(source, schema.FAULT_SOURCES),
        "gpu_index": pa.nulls(n, pa.int16()),
        "address": pa.array(addr),
        "block_2m": pa.array(addr & ~np.uint64((2 << 20) - 1)),
        "fault_type_code": pa.array(ftype),
        "fault_type": _strings_from(ftype, schema.FAULT_TYPES),
        "access_type_code": pa.array(access),
        "access_type": _strings_from(access, schema.ACCESS_TYPES),
        "instances": pa.nulls(n, pa.uint16()),
        "batch_id": pa.nulls(n, pa.uint32()),
        "ip": pa.array(np.ascontiguousarray(ev["ip"])),
        # GPU-fault and uvm_tools columns: a CPU fault from the tracepoint has none
        "ts_gpu_ns": pa.nulls(n, pa.uint64()),
        "gpc_id": pa.nulls(n, pa.uint16()),
        "channel_id": pa.nulls(n, pa.uint16()),
        "client_id": pa.nulls(n, pa.uint16()),
        "cpu_id": pa.nulls(n, pa.uint32()),
    }
    return _batch(schema.FAULTS, cols)
