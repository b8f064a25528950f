"""TEST WORKLOAD for the FUSE stand-in: one process holding GPU memory on command, for
the out-of-memory scenarios (oom_scenario.py). It opens the stand-in as an RM client
(a device and subdevice per GPU: GET_PIDS names it) and reads commands on stdin, one
per line, answering one JSON line on stdout each:

    alloc NAME MIB   RM_ALLOC of NV01_MEMORY_LOCAL_USER (vidmem, 2 MiB pages) on GPU 0
                     -> {"status": NV_STATUS, "offset": bytes or null}
    free NAME        RM_FREE of it -> {"status": 0}
    quit             close everything and exit

`python -m tests.standin.oom_workload DEVDIR`.
"""

from __future__ import annotations

import ctypes
import json
import sys

from gputrace.record.driver_version import parse_version
from gputrace.record.rm_query.client import RmClient
from tests.standin.standin import DRIVER_VERSION

NV01_MEMORY_LOCAL_USER = 0x40
ATTR_PAGE_SIZE_HUGE = 3 << 23  # 2 MiB pages: the stand-in aligns each block to 2 MiB
MIB = 1 << 20


class MemoryAllocationParams(ctypes.Structure):
    """NV_MEMORY_ALLOCATION_PARAMS (128 bytes; nvstandin.h pins the offsets)."""

    _fields_ = [("owner", ctypes.c_uint32), ("type", ctypes.c_uint32),
                ("flags", ctypes.c_uint32), ("width", ctypes.c_uint32),
                ("height", ctypes.c_uint32), ("pitch", ctypes.c_int32),
                ("attr", ctypes.c_uint32), ("attr2", ctypes.c_uint32),
                ("format", ctypes.c_uint32), ("comprCovg", ctypes.c_uint32),
                ("zcullCovg", ctypes.c_uint32), ("_pad", ctypes.c_uint32),
                ("rangeLo", ctypes.c_uint64), ("rangeHi", ctypes.c_uint64),
                ("size", ctypes.c_uint64), ("alignment", ctypes.c_uint64),
                ("offset", ctypes.c_uint64), ("limit", ctypes.c_uint64),
                ("address", ctypes.c_uint64), ("ctagOffset", ctypes.c_uint32),
                ("hVASpace", ctypes.c_uint32), ("internalflags", ctypes.c_uint32),
                ("tag", ctypes.c_uint32), ("numaNode", ctypes.c_int32),
                ("_tail", ctypes.c_uint32)]  # fmt: skip


assert ctypes.sizeof(MemoryAllocationParams) == 128
assert MemoryAllocationParams.size.offset == 64 and MemoryAllocationParams.attr.offset == 24


def main(devdir: str) -> int:
    c = RmClient.open(devdir, parse_version(DRIVER_VERSION), devdir)
    gpu = c.gpus[0]
    held: dict[str, int] = {}
    print(json.dumps({"ready": True}), flush=True)
    try:
        for line in sys.stdin:
            words = line.split()
            if not words or words[0] == "quit":
                break
            if words[0] == "alloc":
                p = MemoryAllocationParams(attr=ATTR_PAGE_SIZE_HUGE, size=int(words[2]) * MIB)
                st, h = c._alloc(gpu.h_device, NV01_MEMORY_LOCAL_USER, p)
                if st == 0:
                    held[words[1]] = h
                reply = {"status": st, "offset": p.offset if st == 0 else None}
            elif words[0] == "free":
                c._free(gpu.h_device, held.pop(words[1]))
                reply = {"status": 0}
            else:
                reply = {"error": f"unknown command {words[0]!r}"}
            print(json.dumps(reply), flush=True)
    finally:
        c.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
