"""TEST STAND-IN workload: "tensors" from Python through the stand-in libc10_cuda.so's
caching allocator (ctypes), from named functions, so each tensor's Python line is known.
Standard library only (any CPython 3.10+).

    python torch_workload.py LIBC10_CUDA [--wait] [--iterations N] [--deferred] [--streams]
                                             [--oom] [--empty-cache]
    python torch_workload.py LIBC10_CUDA --bench N [--depth D] [--wait]
                                             # CPU ns per malloc+free pair

Planted truth (lines found by their `# PLANT:` markers, never hard-coded):
  - `weights()` allocates WEIGHTS tensors (sizes in WEIGHT_SIZES, `# PLANT: weight`),
    kept to the end (alive at exit, not a leak of the loop);
  - `step()` (called `--iterations` times, default 4) allocates a 3 MiB activation
    (`# PLANT: activation`) and frees it, and allocates one 256 KiB tensor kept in
    `HISTORY` (`# PLANT: leak`): growth of 256 KiB per iteration;
  - with --oom, `too_big()` asks for OOM_BYTES (`# PLANT: oom`) with the stand-in
    libcuda's cap below it (GPUTRACE_STANDIN_CUDA_MAX set by the test): the
    allocator frees its unused cached segments, fails again and throws; the call
    returns 0 (the exception caught in C++, as PyTorch turns it into Python's);
  - with --deferred, `captured()` allocates a 128 KiB tensor (`# PLANT: early`),
    frees it during a CUDA graph capture (the async backend defers it) and after the
    capture allocates 64 KiB (`# PLANT: after`), whose malloc gives the first back;
  - with --streams, `side_stream()` allocates 1 MiB (`# PLANT: shared`), records a
    side stream's use of it and frees it (the native allocator defers it: given back
    at the next malloc, 512 KiB, `# PLANT: next`), then allocates 2 KiB (`# PLANT:
    held`), records the side stream and frees it: still held at the end;
  - with --empty-cache, `burst()` allocates and frees 40 MiB (`# PLANT: burst`), then
    the cache is emptied (with expandable segments: pages mapped for the burst are
    unmapped).
The allocator's backend and expandable segments follow PYTORCH_CUDA_ALLOC_CONF, as
PyTorch's do (`backend:cudaMallocAsync`, `expandable_segments:True`).
With --wait it prints `READY <pid>` (the library loaded) and waits for a line before
its calls, prints `ALLOCATED` with each pointer and size on the lines before it
(`T <ptr> <size> <where>`, `F <ptr>`, `OOM <size>`, `RESERVED <n>`, `ALLOCATED_BYTES <n>`,
`PAGES <mapped> <unmapped>`: expandable segments' pages over the run, `PENDING <n>`:
bytes freed and still held for another stream),
then waits for another line before it exits, printing DONE last.
"""

from __future__ import annotations

import ctypes
import sys
import time

KIB, MIB = 1 << 10, 1 << 20
WEIGHT_SIZES = (1000, 64 * KIB, 5 * MIB)
OOM_BYTES = 96 * MIB
LIB: ctypes.CDLL
HISTORY: list[int] = []
KEPT: list[int] = []
OUT: list[str] = []


def _malloc(size: int) -> int:
    return int(LIB.standin_torch_malloc(size, 0, 0))


def weights() -> None:
    for size in WEIGHT_SIZES:
        p = LIB.standin_torch_malloc(size, 0, 0)  # PLANT: weight
        KEPT.append(p)
        OUT.append(f"T {p} {size} weight")


def step() -> None:
    act = LIB.standin_torch_malloc(3 * MIB, 0, 0)  # PLANT: activation
    OUT.append(f"T {act} {3 * MIB} activation")
    kept = LIB.standin_torch_malloc(256 * KIB, 0, 0)  # PLANT: leak
    HISTORY.append(kept)
    OUT.append(f"T {kept} {256 * KIB} leak")
    LIB.standin_torch_free(ctypes.c_ulonglong(act))
    OUT.append(f"F {act}")


def captured() -> None:
    early = LIB.standin_torch_malloc(128 * KIB, 0, 0)  # PLANT: early
    OUT.append(f"T {early} {128 * KIB} early")
    LIB.standin_torch_capture(1)
    LIB.standin_torch_free(ctypes.c_ulonglong(early))
    OUT.append(f"F {early}")
    LIB.standin_torch_capture(0)
    after = LIB.standin_torch_malloc(64 * KIB, 0, 0)  # PLANT: after
    OUT.append(f"T {after} {64 * KIB} after")


SIDE = 0x5151  # a side stream's handle (the stand-in runs no work on it)


def side_stream() -> None:
    shared = LIB.standin_torch_malloc(MIB, 0, 0)  # PLANT: shared
    OUT.append(f"T {shared} {MIB} shared")
    LIB.standin_torch_record_stream(ctypes.c_ulonglong(shared), ctypes.c_ulonglong(SIDE))
    LIB.standin_torch_free(ctypes.c_ulonglong(shared))
    OUT.append(f"F {shared}")
    nxt = LIB.standin_torch_malloc(512 * KIB, 0, 0)  # PLANT: next
    OUT.append(f"T {nxt} {512 * KIB} next")
    held = LIB.standin_torch_malloc(2 * KIB, 0, 0)  # PLANT: held
    OUT.append(f"T {held} {2 * KIB} held")
    LIB.standin_torch_record_stream(ctypes.c_ulonglong(held), ctypes.c_ulonglong(SIDE))
    LIB.standin_torch_free(ctypes.c_ulonglong(held))
    OUT.append(f"F {held}")


def burst() -> None:
    big = LIB.standin_torch_malloc(40 * MIB, 0, 0)  # PLANT: burst
    OUT.append(f"T {big} {40 * MIB} burst")
    LIB.standin_torch_free(ctypes.c_ulonglong(big))
    OUT.append(f"F {big}")
    LIB.standin_torch_empty_cache()


def too_big() -> None:
    p = LIB.standin_torch_malloc(OOM_BYTES, 0, 0)  # PLANT: oom
    OUT.append(f"OOM {OOM_BYTES}" if p == 0 else f"T {p} {OOM_BYTES} oom")


def bench(n: int, depth: int = 1) -> float:
    """CPU ns of the calling thread per malloc + free pair of 4 KiB (a cached block:
    no segment call), from a Python stack `depth` frames above main."""
    if depth > 1:
        return bench(n, depth - 1)
    t0 = time.thread_time_ns()
    for _ in range(n):
        p = _malloc(4096)
        LIB.standin_torch_free(ctypes.c_ulonglong(p))
    return (time.thread_time_ns() - t0) / n


def main() -> None:
    global LIB
    args = sys.argv[1:]
    LIB = ctypes.CDLL(args[0])
    LIB.standin_torch_malloc.restype = ctypes.c_ulonglong
    LIB.standin_torch_malloc.argtypes = [ctypes.c_ulong, ctypes.c_int, ctypes.c_ulonglong]
    LIB.standin_torch_reserved.restype = ctypes.c_ulonglong
    LIB.standin_torch_allocated.restype = ctypes.c_ulonglong
    LIB.standin_torch_pages.restype = ctypes.c_ulonglong
    LIB.standin_torch_pending.restype = ctypes.c_ulonglong
    if "--bench" in args:
        n = int(args[args.index("--bench") + 1])
        depth = int(args[args.index("--depth") + 1]) if "--depth" in args else 1
        if "--wait" in args:
            print(f"READY {__import__('os').getpid()}", flush=True)
            sys.stdin.readline()
        bench(n // 10, depth)  # warm: the segment is made here
        print(f"bench {bench(n, depth):.1f}", flush=True)
        return
    wait = "--wait" in args
    iterations = int(args[args.index("--iterations") + 1]) if "--iterations" in args else 4
    if wait:
        print(f"READY {__import__('os').getpid()}", flush=True)
        sys.stdin.readline()
    weights()
    for _ in range(iterations):
        step()
    if "--deferred" in args:
        captured()
    if "--streams" in args:
        side_stream()
    if "--oom" in args:
        too_big()
    if "--empty-cache" in args:
        burst()
    OUT.append(f"RESERVED {LIB.standin_torch_reserved()}")
    OUT.append(f"ALLOCATED_BYTES {LIB.standin_torch_allocated()}")
    OUT.append(f"PAGES {LIB.standin_torch_pages(0)} {LIB.standin_torch_pages(1)}")
    OUT.append(f"PENDING {LIB.standin_torch_pending()}")
    print("\n".join(OUT), flush=True)
    print("ALLOCATED", flush=True)
    if wait:
        sys.stdin.readline()
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
