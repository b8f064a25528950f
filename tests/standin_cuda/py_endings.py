"""TEST STAND-IN workload in Python: a short training-style loop that allocates
through the stand-in libcuda (ctypes) and then ends in one of the ways real
programs end, with no waiting protocol: nothing waits for the recorder.

    python py_endings.py LIBCUDA ENDING LOG

ENDING is one of ENDINGS. It appends `<pid> <ending>` to LOG first (the test
finds each process's ending there), then:
  - `train()` calls `step()` STEPS times, each calling `leak()`, which allocates
    1 MiB with cuMemAlloc_v2 on the line marked `# PLANT: leak`, never freed;
  - right after the last allocation: `normal` returns (the interpreter
    finalizes and exits 0), `exception` raises RuntimeError("CUDA out of
    memory") from the loop (uncaught: exit 1), `sys_exit` calls sys.exit(3),
    `os_exit` calls os._exit(0) (no finalization at all), `sigterm` and
    `sigkill` print ALLOCATED and wait for their launcher's signal;
  - `forged_table`: as `normal`, with `leak`'s code object replaced by one whose
    line table is a forged MiB (3.11+: one varint that never ends; 3.10: a new line
    per instruction), as a hostile process could hand the recorder;
  - `thread`: before the loop, a daemon thread allocates 4 MiB from
    `worker_leak()` (`# PLANT: thread`), then keeps allocating and freeing
    64 KiB from `spin()` while the main thread returns and the process exits.
Standard library only; any CPython 3.10+.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading

MIB = 1 << 20
STEPS = 3
ENDINGS = ("normal", "exception", "sys_exit", "os_exit", "thread", "sigterm", "sigkill",
           "forged_table")
FORGED = 1 << 20
LIB: ctypes.CDLL


def leak() -> None:
    ptr = ctypes.c_ulonglong(0)
    LIB.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(MIB))  # PLANT: leak


def step() -> None:
    leak()


def worker_leak(started: threading.Event) -> None:
    ptr = ctypes.c_ulonglong(0)
    LIB.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(4 * MIB))  # PLANT: thread
    started.set()
    spin()


def spin() -> None:
    ptr = ctypes.c_ulonglong(0)
    while True:
        LIB.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(64 << 10))
        LIB.cuMemFree_v2(ptr)


def train(ending: str) -> None:
    for i in range(STEPS):
        step()
        if i == STEPS - 1 and ending == "exception":
            raise RuntimeError("CUDA out of memory")


def main(argv: list[str]) -> int:
    global LIB
    LIB = ctypes.CDLL(argv[1])
    LIB.cuMemFree_v2.argtypes = [ctypes.c_ulonglong]
    ending = argv[2]
    if ending not in ENDINGS:
        raise SystemExit(f"unknown ending {ending!r}")
    with open(argv[3], "a") as log:
        log.write(f"{os.getpid()} {ending}\n")
    dev, ctx = ctypes.c_int(0), ctypes.c_void_p(0)
    if (LIB.cuInit(0) or LIB.cuDeviceGet(ctypes.byref(dev), 0)
            or LIB.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev)):
        raise SystemExit("the stand-in libcuda did not make a context")
    if ending == "forged_table":
        if sys.version_info >= (3, 11):
            table = bytes([0x80 | 13 << 3]) + b"\x7f" * (FORGED - 2) + b"\x00"
        else:
            table = bytes([2, 1]) * (FORGED // 2)
        leak.__code__ = leak.__code__.replace(co_linetable=table)
    if ending == "thread":
        started = threading.Event()
        threading.Thread(target=worker_leak, args=(started,), daemon=True).start()
        started.wait()
    train(ending)
    if ending == "sys_exit":
        sys.exit(3)
    if ending == "os_exit":
        os._exit(0)
    if ending in ("sigterm", "sigkill"):
        print("ALLOCATED", flush=True)
        while True:
            signal.pause()
    return 0


if __name__ == "__main__":
    main(sys.argv)
