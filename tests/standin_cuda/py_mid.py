"""TEST STAND-IN workload in Python for the whole-stack unwinder: segments of the
stand-in caching allocator through a library without frame pointers mid-stack,
called by ctypes from named functions:

    python py_mid.py BUILD_DIR N

  model() -> tensor() -> [ctypes, libffi] -> mid_outer (libmid_a, no frame pointers)
    -> mid_middle (libmid_b) -> cache_alloc -> grow_segment (libcaching_standin)
    -> cuMemAlloc_v2

N segment allocations, the call on the line marked `# PLANT: tensor`. It prints
`READY <pid>` and waits for a line before its calls, then `ALLOCATED` and waits
for another before it frees them and exits (the recorder names code objects while
the process lives), then `DONE`."""

from __future__ import annotations

import ctypes
import os
import sys

LIB: ctypes.CDLL


def tensor(i: int) -> int:
    return int(LIB.mid_outer(3 << 20, i))  # PLANT: tensor


def model(n: int) -> None:
    for i in range(n):
        if tensor(i) == 0:
            raise SystemExit("mid_outer failed")


def main() -> None:
    global LIB
    d, n = sys.argv[1], int(sys.argv[2])
    cuda = ctypes.CDLL(os.path.join(d, "libcuda.so.1"))
    LIB = ctypes.CDLL(os.path.join(d, "libmid_a.so"))
    LIB.mid_outer.restype = ctypes.c_ulonglong
    LIB.mid_outer.argtypes = [ctypes.c_size_t, ctypes.c_ulong]
    cache = ctypes.CDLL(os.path.join(d, "libcaching_standin.so"))
    dev, ctx = ctypes.c_int(0), ctypes.c_void_p(0)
    if cuda.cuInit(0) or cuda.cuDeviceGet(ctypes.byref(dev), 0) or \
            cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev):  # fmt: skip
        raise SystemExit("no stand-in context")
    print(f"READY {os.getpid()}", flush=True)
    sys.stdin.readline()
    model(n)
    print("ALLOCATED", flush=True)
    sys.stdin.readline()
    cache.cache_release_all()
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
