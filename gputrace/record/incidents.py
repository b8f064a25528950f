"""Out-of-memory incidents as the recorder sees them: which decoded rows are a
"no memory" failure (`Incident`, one record of one failure for every part of the
recorder: `record --freeze-on oom` and the `gputrace_oom_total` metric give each
the verdict of the latest GPU memory sample), and a signal the recorder's parts
subscribe to (the RM sampler queries the GPU at once; a flight recorder may freeze
its window).

A failure is "no memory" by the rule of `gputrace.oom_rules` (its one home, shared
with the `oom` report), applied here to pyarrow batches; the verdict is that
module's too.

The check is one vectorized compare of a batch's status column; only the rows that
fail are looked at further, so batches without failures cost next to nothing.

RM and UVM failures also come early: the ioctl probe sends each one at once as an
`oom_event` (probes/gputrace_events.h; mirror `OOM_DTYPE`) to a thread of its own
(`gputrace/record/oom_watch.py`), before the decoded row exists. The signal
delivers each failure once: the decoded row of a failure the probe already sent
(same pid, same return time) is not delivered again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gputrace import oom_rules, schema
from gputrace.oom_rules import (
    CUDA_ERROR_OUT_OF_MEMORY,
    NV_ERR_NO_MEMORY,
    OOM_CUDA_HOST,
    OOM_CUDA_PREFIX,
    RM_ALLOC_CALLS,
)
from gputrace.record.structs import mirror

Batch = pa.Table | pa.RecordBatch

OOM_DTYPE = np.dtype(
    [("ts_ns", "<u8"), ("pid", "<u4"), ("status", "<u4"), ("nr", "<u4"), ("device", "u1"),
     ("_pad0", "u1"), ("gpu_index", "<i2")]
)  # fmt: skip
mirror("gputrace_events.h", "oom_event", OOM_DTYPE)
"""`struct oom_event` (probes/gputrace_events.h), checked by test_event_structs."""
SEEN_KEEP = 4096
"""Failures remembered to deliver each once (probe record, then its decoded row)."""


@dataclass(frozen=True)
class Incident:
    """One "no memory" failure. `ts_ns` is when the failed call returned
    (CLOCK_MONOTONIC); `gpu_index` None when the row does not say (a cuMemAlloc
    fails in whatever context is current; RM_ALLOC goes through nvidiactl).
    `start_ns` (when the call was made) and `comm` come with the decoded row; the
    probe's early record has neither (None)."""

    ts_ns: int
    pid: int
    layer: str  # "api", "rm" or "uvm"
    call: str  # the function or ioctl command that failed
    status: int  # CUresult or NV_STATUS
    gpu_index: int | None = None
    size_bytes: int | None = None  # the bytes requested
    start_ns: int | None = None
    comm: str | None = None


Mask = Any  # a pyarrow boolean Array or ChunkedArray (pyarrow's stubs type compute loosely)


def _column(batch: Batch, name: str) -> Any:
    return batch.column(name) if name in batch.schema.names else None


def is_oom(table: str, batch: Batch) -> Mask:
    """Boolean mask over `batch`'s rows: a "no memory" failure. None when the table is
    not one that holds failures or the batch has none (the usual case)."""
    if table == "cuda_calls":
        result = _column(batch, "result")
        if result is None:
            return None
        hit: Any = pc.fill_null(pc.equal(result, pa.scalar(CUDA_ERROR_OUT_OF_MEMORY)), False)
        if not pc.any(hit).as_py():
            return None
        func: Any = pc.cast(_column(batch, "func"), pa.string())
        device = pc.and_(pc.starts_with(func, OOM_CUDA_PREFIX),
                         pc.invert(pc.starts_with(func, OOM_CUDA_HOST)))
        return pc.and_(hit, pc.fill_null(device, False))
    if table == "ioctls":
        status = _column(batch, "status")
        if status is None:
            return None
        hit = pc.fill_null(pc.equal(status, pa.scalar(NV_ERR_NO_MEMORY)), False)
        if not pc.any(hit).as_py():
            return None
        name: Any = pc.cast(_column(batch, "name"), pa.string())
        rm: Any = pc.is_in(name, value_set=pa.array(RM_ALLOC_CALLS))
        uvm: Any = pc.equal(_column(batch, "device_code"), pa.scalar(schema.DEV_UVM))
        return pc.and_(hit, pc.fill_null(pc.or_(rm, uvm), False))
    return None


def incidents(table: str, batch: Batch) -> list[Incident]:
    """The "no memory" failures among `batch`'s rows, in row order."""
    mask = is_oom(table, batch)
    if mask is None or not pc.any(mask).as_py():
        return []
    rows = batch.filter(mask).to_pylist()
    out = []
    for r in rows:
        start = int(r["ts_ns"])
        done = start + int(r.get("latency_ns") or 0)
        if table == "cuda_calls":
            out.append(Incident(done, int(r["pid"]), "api", str(r["func"]), int(r["result"]),
                                None, r.get("size_bytes"), start, r.get("comm")))  # fmt: skip
        else:
            uvm = r["device_code"] == schema.DEV_UVM
            out.append(Incident(done, int(r["pid"]), "uvm" if uvm else "rm", str(r["name"]),
                                int(r["status"]), r.get("gpu_index"), r.get("size_bytes"),
                                start, r.get("comm")))  # fmt: skip
    return out


Subscriber = Callable[[Incident], None]


class IncidentSignal:
    """Fan-out of incidents to subscribers: `observe(table, batch)` is called with
    every batch the recorder appends; each subscriber gets every incident, in order,
    on the recorder's writer thread (a subscriber must return quickly: hand the
    work to its own thread)."""

    def __init__(self) -> None:
        self._subs: list[Subscriber] = []
        self._lock = threading.Lock()
        self._seen: OrderedDict[tuple[int, int], None] = OrderedDict()
        self.count = 0
        self.early = 0  # delivered from the probe's own record, before decoding

    def subscribe(self, fn: Subscriber) -> None:
        with self._lock:
            self._subs.append(fn)

    def observe(self, table: str, batch: Batch) -> None:
        """Deliver the failures among a decoded batch's rows."""
        if table not in ("cuda_calls", "ioctls"):
            return
        for inc in incidents(table, batch):
            self.fire(inc)

    def fire(self, inc: Incident, early: bool = False) -> None:
        """Deliver one failure to every subscriber, unless it was delivered already."""
        key = (inc.pid, inc.ts_ns)
        with self._lock:
            if key in self._seen:
                return
            self._seen[key] = None
            if len(self._seen) > SEEN_KEEP:
                self._seen.popitem(last=False)
            self.count += 1
            self.early += early
            subs = list(self._subs)
        for fn in subs:
            fn(inc)


def from_probe(rec: np.void, api_names: Mapping[int, str] | None = None) -> Incident:
    """The Incident of one `oom_event` record: of the ioctl probe, or of the API
    layer's (`api_names`: its function ids, then `nr` is one and `status` a CUresult)."""
    from gputrace.nvabi import RM_ESCAPE_NAMES

    if api_names is not None:
        nr = int(rec["nr"])
        return Incident(int(rec["ts_ns"]), int(rec["pid"]), "api",
                        api_names.get(nr, f"function {nr}"), int(rec["status"]))
    uvm = int(rec["device"]) == schema.DEV_UVM
    nr = int(rec["nr"])
    call = f"UVM command {nr}" if uvm else RM_ESCAPE_NAMES.get(nr, f"RM escape {nr:#x}")
    gpu = int(rec["gpu_index"])
    return Incident(int(rec["ts_ns"]), int(rec["pid"]), "uvm" if uvm else "rm", call,
                    int(rec["status"]), gpu if gpu >= 0 else None)


VERDICTS = oom_rules.VERDICTS


def verdict(requested: int | None, sample: Mapping[str, Any] | None) -> str:
    """Why an allocation of `requested` bytes failed, by a GPU memory sample
    (`gpu_memory` row): `gputrace.oom_rules.verdict`, the `oom` report's rule."""
    if sample is None:
        return "unknown"
    return oom_rules.verdict(requested, sample.get("heap_free_bytes"),
                             sample.get("largest_free_bytes"))
