"""SYNTHETIC: a fake of the driver side of the UVM tools protocol, for unit tests.

It stands in for the kernel's ioctl handlers (`uvm_tools.ioctl` is patched to
`FakeToolsDriver.ioctl`): it keeps the queue and control addresses a tracker
registers and writes records into that memory the way `uvm_tools.c` does
(put_behind advances, a record is dropped and counted when one free slot is
left). No driver, no stand-in: the live tests use the FUSE stand-in instead.
"""

from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass, field
from typing import Any

from gputrace.record.uvm_tools import abi as ut

GPU_UUID = bytes(range(0x10, 0x20))
CPU_UUID = bytes.fromhex("a65e0f4ed7d47ba25047412c142a7773")


@dataclass
class FakeTracker:
    queue: int
    entries: int
    control: int
    counters_addr: int
    events: int = 0


@dataclass
class FakeToolsDriver:
    """Per fd number: the tracker registered on it; calls in order."""

    entry_size: int = 72
    trackers: dict[int, FakeTracker] = field(default_factory=dict)
    calls: list[tuple[int, int]] = field(default_factory=list)
    fail_init: dict[int, int] = field(default_factory=dict)  # uvm fd -> rmStatus
    table: dict[int, bytes] = field(default_factory=lambda: {0: CPU_UUID, 1: GPU_UUID})

    def ioctl(self, fd: int, cmd: int, params: ctypes.Structure) -> None:
        p: Any = params  # one of several param structs, by command
        self.calls.append((fd, cmd))
        if cmd in (ut.TOOLS_INIT_EVENT_TRACKER, ut.TOOLS_INIT_EVENT_TRACKER_V2):
            st = self.fail_init.get(int(p.uvmFd), 0)
            if not st:
                self.trackers[fd] = FakeTracker(p.queueBuffer, p.queueBufferSize,
                                                p.controlBuffer, p.controlBuffer)
            p.rmStatus = st
        elif cmd in (ut.TOOLS_GET_PROCESSOR_UUID_TABLE, ut.TOOLS_GET_PROCESSOR_UUID_TABLE_V2):
            for i, u in self.table.items():
                ctypes.memmove(p.tablePtr + 16 * i, u, 16)
            p.rmStatus = 0
        else:
            p.rmStatus = 0

    def queue_tracker(self) -> FakeTracker:
        return next(t for t in self.trackers.values() if t.entries)

    def emit(self, records: bytes) -> int:
        """Write records as the driver does; returns how many were dropped."""
        t = self.queue_tracker()
        ctl = ut.ControlData.from_address(t.control)
        mask, es, dropped = t.entries - 1, self.entry_size, 0
        for off in range(0, len(records), es):
            rec = records[off : off + es]
            put, get = ctl.put_behind & mask, ctl.get_behind & mask
            if ((t.entries + get - put) & mask) == 1:
                ctl.dropped[rec[0]] += 1
                dropped += 1
                continue
            ctypes.memmove(t.queue + put * es, rec, es)
            ctl.put_ahead = ctl.put_behind = (put + 1) & mask
        return dropped

    def set_counters(self, values: list[int]) -> None:
        t = next(t for t in self.trackers.values() if not t.entries)
        arr = (ctypes.c_uint64 * ut.TOTAL_COUNTERS).from_address(t.counters_addr)
        for i, v in enumerate(values):
            arr[i] = v


def gpu_fault_v2(batch: int, address: int, ts: int, gpu: int = 1, access: int = 2) -> bytes:
    """SYNTHETIC UvmEventGpuFaultInfo_V2 record (72 bytes)."""
    rec = struct.pack("<BBHHHQQQIBB", 3, 2, gpu, 0, 0, address, ts, ts + 5, batch, 1, access)
    return rec.ljust(72, b"\0")


def replay_v2(batch: int, ts: int, gpu: int = 1) -> bytes:
    """SYNTHETIC UvmEventGpuFaultReplayInfo_V2 record."""
    return struct.pack("<BBHIQQ", 4, 1, gpu, batch, ts, ts + 5).ljust(72, b"\0")


def migration_v2(src: int, dst: int, address: int, size: int, begin: int, end: int,
                 cause: int = 2) -> bytes:
    """SYNTHETIC UvmEventMigrationInfo_V2 record."""
    rec = struct.pack("<BBHHHiiQQQQQQQ", 2, cause, 0, src, dst, -1, -1, address, size,
                      begin, end, 0, 0, 0)
    return rec.ljust(72, b"\0")
