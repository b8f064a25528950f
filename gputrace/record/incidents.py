"""Incidents seen while recording, from the rows just decoded: an allocation that
failed for want of GPU memory (`record --freeze-on oom`), in the API layer (a
cuMemAlloc* returning CUDA_ERROR_OUT_OF_MEMORY) or in the syscall layer (an RM
allocation escape returning NV_ERR_NO_MEMORY); and the verdict the latest GPU
memory sample gives it (the `gputrace_oom_total` metric)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from gputrace import nvabi

RM_ALLOC_ESCAPES = (nvabi.ESC_RM_ALLOC, nvabi.ESC_RM_ALLOC_MEMORY)
VERDICTS = ("capacity", "fragmentation", "unknown")


@dataclass(frozen=True)
class Oom:
    """One allocation refused for want of memory."""

    ts_ns: int
    pid: int
    comm: str | None
    layer: str  # "api" or "syscall"
    call: str  # cuMemAlloc_v2, RM_ALLOC, ...
    requested_bytes: int | None
    gpu_index: int | None  # None: the API layer does not say which GPU


def ooms(table: str, rows: pa.Table) -> list[Oom]:
    """The failed-for-memory allocations among `rows` of `table`, in time order."""
    hit: Any
    if table == "cuda_calls":
        hit = pc.and_(pc.starts_with(rows["func"], "cuMemAlloc"),
                      pc.equal(rows["result"], pa.scalar(nvabi.CUDA_ERROR_OUT_OF_MEMORY,
                                                         pa.int32())))  # fmt: skip
        layer, call, gpu = "api", "func", None
    elif table == "ioctls":
        hit = pc.and_(pc.is_in(rows["nr"], pa.array(RM_ALLOC_ESCAPES, pa.uint32())),
                      pc.equal(rows["status"], pa.scalar(nvabi.NV_ERR_NO_MEMORY,
                                                         pa.uint32())))  # fmt: skip
        layer, call, gpu = "syscall", "name", "gpu_index"
    else:
        return []
    got = rows.filter(pc.fill_null(hit, False))
    out = [Oom(int(r["ts_ns"]), int(r["pid"]), r["comm"], layer, str(r[call]),
               r["size_bytes"], r[gpu] if gpu else None)
           for r in got.to_pylist()]  # fmt: skip
    return sorted(out, key=lambda o: o.ts_ns)


def verdict(requested: int | None, sample: dict[str, Any] | None) -> str:
    """Why an allocation of `requested` bytes failed, by a GPU memory sample
    (`gpu_memory` row): capacity (more than was free), fragmentation (no more than
    was free, more than the largest free region), else unknown."""
    if requested is None or sample is None:
        return "unknown"
    free, largest = sample.get("heap_free_bytes"), sample.get("largest_free_bytes")
    if free is not None and requested > free:
        return "capacity"
    if free is not None and largest is not None and free >= requested > largest:
        return "fragmentation"
    return "unknown"
