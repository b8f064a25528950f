"""Numpy mirrors and bulk decoding for the API layer (cuda_event and friends in
probes/gputrace_events.h): libcuda calls into `cuda_calls` batches."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from gputrace import schema
from gputrace.record.decode import _batch, _by_time, _strings_from, _who
from gputrace.record.python_stacks import stack_keys
from gputrace.record.structs import mirror

# ---------------------------------------------------------------- API layer
CUDA_DTYPE = np.dtype(
    [
        ("ts_ns", "<u8"), ("latency_ns", "<u8"), ("size_bytes", "<u8"), ("ptr", "<u8"),
        ("handle", "<u8"), ("flags", "<u8"), ("stream", "<u8"), ("pid", "<u4"), ("tid", "<u4"),
        ("result", "<i4"), ("stack_id", "<i4"), ("func", "<u2"), ("valid", "u1"),
        ("_pad0", "u1"), ("py_stack_id", "<i4"), ("comm", "S16"),
    ]
)  # fmt: skip
mirror("gputrace_events.h", "cuda_event", CUDA_DTYPE)
CUDA_PAUSE_DTYPE = np.dtype(
    [("ts_ns", "<u8"), ("kinds", "<u4"), ("fd", "<i4"), ("stopped", "<u4"), ("_pad0", "<u4"),
     ("stop_boot_ns", "<u8")]
)  # fmt: skip
mirror("gputrace_events.h", "cuda_pause", CUDA_PAUSE_DTYPE)
PY_PROC_DTYPE = np.dtype(
    [("interp_head", "<u8"), ("page_mask", "<u8"), ("interp_next", "<u2"),
     ("interp_threads", "<u2"),
     ("ts_next", "<u2"), ("ts_tid", "<u2"), ("ts_frame", "<u2"), ("ts_size", "<u2"),
     ("cframe_frame", "<u2"), ("pthread_tid", "<u2"), ("fr_code", "<u2"), ("fr_prev", "<u2"),
     ("fr_instr", "<u2"), ("fr_entry", "<u2"), ("fr_owner", "<u2"), ("fr_size", "<u2"),
     ("shim_owner", "<u2"), ("entry_all", "u1"), ("entry_mask", "u1")]
)  # fmt: skip
mirror("gputrace_events.h", "py_proc", PY_PROC_DTYPE)
"""struct py_proc: the `cuda_py_procs` map's value (python_stacks fills it)."""
CUDA_CONFIG_DTYPE = np.dtype(
    [("self_tgid", "<u4"), ("filter", "<u4"), ("pause", "<u4"), ("comm_cache", "<u4")]
)
mirror("gputrace_events.h", "cuda_config", CUDA_CONFIG_DTYPE)
# GT_CV_* bits of cuda_event.valid, by column
CUDA_VALID_BITS: dict[str, int] = {"size_bytes": 0, "ptr": 1, "handle": 2, "flags": 3, "stream": 4}


def cuda_calls_batch(ev: npt.NDArray[np.void], names: Mapping[int, str]) -> pa.RecordBatch:
    """Decoded `struct cuda_event`s as a record batch of the `cuda_calls` table;
    `names` maps function ids to libcuda symbols."""
    ev = _by_time(ev)
    valid = ev["valid"]
    sid = stack_keys(ev["stack_id"], ev["py_stack_id"])
    cols: dict[str, Any] = {
        **_who(ev),
        "func": _strings_from(ev["func"], names),
        "result": pa.array(ev["result"]),
        "latency_ns": pa.array(ev["latency_ns"].astype(np.int64)),
        "stack_id": pa.array(sid.astype(np.int64), mask=sid < 0),
    }
    for name, bit in CUDA_VALID_BITS.items():
        cols[name] = pa.array(ev[name], mask=(valid & np.uint8(1 << bit)) == 0)
    return _batch(schema.CUDA_CALLS, cols)


