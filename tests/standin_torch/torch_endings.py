"""TEST STAND-IN workload: tensors through the stand-in libc10_cuda.so's caching
allocator (ctypes), from named functions, by a program that ends right after its last
one, with no waiting protocol: nothing waits for the recorder.

    python torch_endings.py LIBC10_CUDA ENDING LOG

ENDING is one of ENDINGS. It appends `<pid> <ending>` to LOG first, then:
  - `forward()` calls `layer()` STEPS times, each allocating a TENSOR-byte tensor on
    the line marked `# PLANT: layer` (one Python stack: its first tensor is new);
  - `last()` allocates one LAST-byte tensor from a stack never seen before (`# PLANT:
    last`), or with `oom` asks for OOM_BYTES on the line marked `# PLANT: oom`
    (GPUTRACE_STANDIN_CUDA_MAX below it, set by the test: malloc throws, the
    stand-in returns 0);
  - each tensor's `T <ptr> <size> <where>` (or `OOM <size>`) appended to LOG, then at
    once: `normal` returns (exit 0), `exception` raises RuntimeError (uncaught:
    exit 1), `os_exit` calls os._exit(0) (no finalization), `abort` crashes with
    os.abort() (SIGABRT), `oom` calls os._exit(2) after the failed request.
Standard library only; any CPython 3.10+.
"""

from __future__ import annotations

import ctypes
import os
import sys

KIB, MIB = 1 << 10, 1 << 20
STEPS = 3
TENSOR = 96 * KIB
LAST = 5 * MIB
OOM_BYTES = 96 * MIB
ENDINGS = ("normal", "exception", "os_exit", "abort", "oom")
LIB: ctypes.CDLL
LOG: list[str] = []


def layer() -> None:
    p = LIB.standin_torch_malloc(TENSOR, 0, 0)  # PLANT: layer
    LOG.append(f"T {p} {TENSOR} layer")


def forward() -> None:
    for _ in range(STEPS):
        layer()


def last(ending: str) -> None:
    if ending == "oom":
        p = LIB.standin_torch_malloc(OOM_BYTES, 0, 0)  # PLANT: oom
        LOG.append(f"OOM {OOM_BYTES}" if p == 0 else f"T {p} {OOM_BYTES} oom")
        return
    p = LIB.standin_torch_malloc(LAST, 0, 0)  # PLANT: last
    LOG.append(f"T {p} {LAST} last")


def main(argv: list[str]) -> int:
    global LIB
    LIB = ctypes.CDLL(argv[1])
    LIB.standin_torch_malloc.restype = ctypes.c_ulonglong
    LIB.standin_torch_malloc.argtypes = [ctypes.c_ulong, ctypes.c_int, ctypes.c_ulonglong]
    ending = argv[2]
    if ending not in ENDINGS:
        raise SystemExit(f"unknown ending {ending!r}")
    with open(argv[3], "a") as log:
        log.write(f"{os.getpid()} {ending}\n")
        forward()
        last(ending)
        log.write("".join(f"{x}\n" for x in LOG))
    if ending == "exception":
        raise RuntimeError("CUDA out of memory")
    if ending == "os_exit":
        os._exit(0)
    if ending == "abort":
        os.abort()
    if ending == "oom":
        os._exit(2)
    return 0


if __name__ == "__main__":
    main(sys.argv)
