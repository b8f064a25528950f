"""TEST STAND-IN workload in Python: allocations through the stand-in libcuda
(ctypes) from named nested functions, so the Python frames of each allocation are
known. Runs under any CPython 3.10+ (standard library only).

    python py_workload.py LIBCUDA [--wait] [--depth N] [--thread] [--bench D,D.. --loops N]

Planted truth (the lines are found by their markers, never hard-coded):
  - `leak()` allocates LEAKS x 1 MiB with cuMemAlloc_v2 on the marked line
    `# PLANT: leak`, never freed; called from `middle()`, from `outer()`, from `main()`.
  - `scratch()` allocates and frees 2 MiB (`# PLANT: scratch`), freed at once.
  - with --thread, `worker()` (run in a threading.Thread named "py-worker") allocates
    1 x 4 MiB on `# PLANT: thread`, never freed.
  - with --depth N, `deep()` recurses N - 1 times and allocates 1 x 8 MiB at the bottom
    (`# PLANT: deep`), freed at once.
  - with --bench D1,D2.. --loops N, `bench()` allocates and frees 64 KiB N times from
    a Python stack D frames deep (main and <module> included), for each D, and prints
    `bench D NS` (the thread's CPU ns per pair: where the probes run).
With --wait it prints `READY <pid>` (libcuda already loaded) and waits for a line on
stdin before its calls, then prints `ALLOCATED` and waits for another line before it
exits (the recorder names code objects while the process lives: a test stops the
recorder first). It prints DONE last.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time

MIB = 1 << 20
LEAKS = 3
LIB: ctypes.CDLL


def _alloc(size: int) -> int:
    ptr = ctypes.c_ulonglong(0)
    r = LIB.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(size))
    if r != 0:
        raise SystemExit(f"cuMemAlloc_v2 returned {r}")
    return ptr.value


def leak() -> None:
    for _ in range(LEAKS):
        ptr = ctypes.c_ulonglong(0)
        LIB.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(MIB))  # PLANT: leak


def middle() -> None:
    leak()


def outer() -> None:
    middle()


def scratch() -> None:
    ptr = ctypes.c_ulonglong(0)
    LIB.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(2 * MIB))  # PLANT: scratch
    LIB.cuMemFree_v2(ptr)


def worker() -> None:
    ptr = ctypes.c_ulonglong(0)
    LIB.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(4 * MIB))  # PLANT: thread


def deep(n: int) -> None:
    if n > 1:
        deep(n - 1)
        return
    ptr = ctypes.c_ulonglong(0)
    LIB.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(8 * MIB))  # PLANT: deep
    LIB.cuMemFree_v2(ptr)


def bench(n: int, loops: int) -> float:
    if n > 1:
        return bench(n - 1, loops)
    ptr = ctypes.c_ulonglong(0)
    alloc, free, size = LIB.cuMemAlloc_v2, LIB.cuMemFree_v2, ctypes.c_size_t(64 << 10)
    ref = ctypes.byref(ptr)
    for _ in range(100):  # warm: the first call of a process is stopped for the recorder
        alloc(ref, size)
        free(ptr)
    t0 = time.thread_time_ns()
    for _ in range(loops):
        alloc(ref, size)
        free(ptr)
    return (time.thread_time_ns() - t0) / loops


def main(argv: list[str]) -> int:
    global LIB
    LIB = ctypes.CDLL(argv[1])
    LIB.cuMemFree_v2.argtypes = [ctypes.c_ulonglong]
    args = argv[2:]
    depth = int(args[args.index("--depth") + 1]) if "--depth" in args else 0
    loops = int(args[args.index("--loops") + 1]) if "--loops" in args else 0
    dev, ctx = ctypes.c_int(0), ctypes.c_void_p(0)
    if (LIB.cuInit(0) or LIB.cuDeviceGet(ctypes.byref(dev), 0)
            or LIB.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev)):
        raise SystemExit("the stand-in libcuda did not make a context")
    wait = "--wait" in args
    if wait:
        print(f"READY {os.getpid()}", flush=True)
        sys.stdin.readline()
    outer()
    scratch()
    if "--thread" in args:
        t = threading.Thread(target=worker, name="py-worker")
        t.start()
        t.join()
    if depth:
        deep(depth)
    if "--bench" in args:
        for d in (int(x) for x in args[args.index("--bench") + 1].split(",")):
            print(f"bench {d} {bench(d - 2, loops):.1f}", flush=True)  # main, <module>: 2
    if wait:
        print("ALLOCATED", flush=True)
        sys.stdin.readline()
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
