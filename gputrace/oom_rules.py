"""When is a failed allocation "out of memory", and why did it fail?

The one home of both rules, shared by the recorder (`gputrace.record.incidents`:
`record --freeze-on oom`, `gputrace_oom_total{gpu,verdict}`) and the `oom` report
(`gputrace.analyses.oom`), so the two always name a failure alike. Pure Python: no
polars, no pyarrow, no bcc (the recorder and the analyses each apply the "no memory"
rule to their own frames with the constants below).

A failure is "no memory" when
- layer api (`cuda_calls`): a device allocation (`cuMemAlloc*`, not `cuMemAllocHost*`)
  returned CUDA_ERROR_OUT_OF_MEMORY (2);
- layer syscall (`ioctls`): RM_ALLOC or RM_VID_HEAP_CONTROL returned NV_ERR_NO_MEMORY
  (0x51) in its parameters, or any nvidia-uvm command did;
- layer allocator (`allocator_events`): the caching allocator logged an `oom` entry.

The verdict of a failure of `requested` bytes, by the GPU's free memory and largest
free region at that instant (RM's FB_GET_INFO_V2), in this order:
- unknown: no usable sample (or no requested size): the evidence names what is missing;
- allocator pool: more than was free, but free plus what caching allocators on that
  GPU held reserved and unallocated would have served it;
- capacity: more than was free;
- fragmentation: no more than was free, more than the largest free region;
- limit: the GPU had room (free and largest free region both large enough): a
  per-process or container limit, a MIG slice or the driver refused it.
"""

from __future__ import annotations

from dataclasses import dataclass

from gputrace.nvabi import CUDA_ERROR_OUT_OF_MEMORY, NV_ERR_NO_MEMORY

__all__ = ["ALLOCATOR_OOM", "CUDA_ERROR_OUT_OF_MEMORY", "NV_ERR_NO_MEMORY", "OOM_CUDA_HOST",
           "OOM_CUDA_PREFIX", "RM_ALLOC_CALLS", "VERDICTS", "Verdict", "is_oom_call",
           "judge", "verdict"]

OOM_CUDA_PREFIX = "cuMemAlloc"
"""cuMemAlloc_v2, Pitch, Managed, Async, FromPoolAsync (and their _ptsz/_ptds): the
device allocations; cuMemAllocHost allocates host memory and is left out."""
OOM_CUDA_HOST = "cuMemAllocHost"
RM_ALLOC_CALLS = ("RM_ALLOC", "RM_VID_HEAP_CONTROL")
ALLOCATOR_OOM = "oom"
"""The allocator layer's action of an out-of-memory entry (PyTorch's trace)."""

VERDICTS = ("capacity", "fragmentation", "allocator pool", "limit", "unknown")


def is_oom_call(layer: str, call: str, status: int | None, uvm: bool = False) -> bool:
    """Is one failed call "no memory"? `layer` api (`call` the CUDA function, `status`
    its CUresult), syscall (`call` the ioctl name, `status` its NV_STATUS, `uvm` for an
    nvidia-uvm command) or allocator (`call` the entry's action)."""
    if layer == "api":
        return (status == CUDA_ERROR_OUT_OF_MEMORY and call.startswith(OOM_CUDA_PREFIX)
                and not call.startswith(OOM_CUDA_HOST))
    if layer == "syscall":
        return status == NV_ERR_NO_MEMORY and (uvm or call in RM_ALLOC_CALLS)
    return layer == "allocator" and call == ALLOCATOR_OOM


@dataclass(frozen=True)
class Verdict:
    """Why one allocation failed, and the sentence that shows it."""

    name: str
    evidence: str


def _b(n: int) -> str:
    from gputrace.units import format_bytes

    return format_bytes(n)


def judge(requested: int | None, free: int | None, largest: int | None,
          pool_bytes: int | None = None, missing: str | None = None) -> Verdict:
    """The verdict of a failed allocation of `requested` bytes on a GPU with `free`
    bytes free and `largest` the largest free region; `pool_bytes` what caching
    allocators on that GPU held reserved but unallocated at that instant (None: no
    allocator layer). `missing` says why there is no sample, when there is none."""
    if requested is None:
        return Verdict("unknown", "the failing call does not say how many bytes it asked")
    if free is None:
        return Verdict("unknown", missing or "no free-memory sample of this GPU")
    if requested > free:
        if pool_bytes and free + pool_bytes >= requested:
            return Verdict("allocator pool",
                           f"requested {_b(requested)} > free {_b(free)}, but caching "
                           f"allocators held {_b(pool_bytes)} reserved and unallocated: "
                           f"free + that = {_b(free + pool_bytes)} would have served it")
        return Verdict("capacity", f"requested {_b(requested)} > free {_b(free)}")
    if largest is None:
        return Verdict("unknown", f"requested {_b(requested)} <= free {_b(free)}, and the "
                                  "largest free region was not sampled")
    if requested > largest:
        return Verdict("fragmentation",
                       f"free {_b(free)} >= requested {_b(requested)} > largest free "
                       f"region {_b(largest)}")
    return Verdict("limit", f"the GPU had room: requested {_b(requested)} <= largest free "
                            f"region {_b(largest)} <= free {_b(free)}; a per-process or "
                            "container limit, a MIG slice or the driver refused it")


def verdict(requested: int | None, free: int | None, largest: int | None,
            pool_bytes: int | None = None) -> str:
    """The name of `judge`'s verdict."""
    return judge(requested, free, largest, pool_bytes).name
