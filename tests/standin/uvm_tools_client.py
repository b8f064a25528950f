"""TEST STAND-IN tracker client: the UVM tools protocol from user space, for tests only.

Not gputrace code (the recorder's client is gputrace/record/uvm_tools/tracker.py). It speaks the
driver-580 protocol of docs/driver-facts.md sections 1.3 and 5 against the
stand-in (tests/standin/nvfuse): INIT_EVENT_TRACKER(_V2) on a nvidia-uvm-tools fd naming
a queue and control buffer in this process and a nvidia-uvm fd (possibly taken from
another process with pidfd_getfd), ENABLE_EVENTS / ENABLE_COUNTERS, and the drain
protocol (read from get_behind up to put_behind, then store the new index in get_ahead
and get_behind).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import struct

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
_libc.syscall.restype = ctypes.c_long

INIT_EVENT_TRACKER, INIT_EVENT_TRACKER_V2 = 56, 76
SET_NOTIFICATION_THRESHOLD, ENABLE_EVENTS, DISABLE_EVENTS = 57, 58, 59
ENABLE_COUNTERS, DISABLE_COUNTERS = 60, 61
GET_PROCESSOR_UUID_TABLE, GET_PROCESSOR_UUID_TABLE_V2, FLUSH_EVENTS = 64, 77, 67
UVM_INITIALIZE = 0x30000001
STANDIN_TEST = 0x5E57  # not part of the real protocol (README)
# queue, count, control, processor, allProcessors, uvmFd, rmStatus
INIT_PARAMS = struct.Struct("<QQQ16sIII4x")
CONTROL_SIZE = 528
TOTAL_COUNTERS = 10
SYS_PIDFD_GETFD = 438


def uvm_ioctl(fd: int, cmd: int, buf: ctypes.Array[ctypes.c_char]) -> None:
    """A UVM ioctl: plain command number, params behind the pointer; OSError on failure."""
    if _libc.ioctl(fd, cmd, ctypes.addressof(buf)) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def status_at(buf: ctypes.Array[ctypes.c_char], off: int) -> int:
    """The rmStatus the driver wrote at offset ``off`` of the params."""
    value: int = struct.unpack_from("<I", buf, off)[0]
    return value


def pidfd_getfd(pid: int, fd: int) -> int:
    """Duplicate another process's fd into this one (root or ptrace rights needed)."""
    pidfd = os.pidfd_open(pid)
    try:
        new = int(_libc.syscall(SYS_PIDFD_GETFD, pidfd, fd, 0))
        if new < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
        return new
    finally:
        os.close(pidfd)


def flags_call(tools_fd: int, cmd: int, flags: int) -> int:
    """ENABLE/DISABLE_EVENTS or _COUNTERS; returns rmStatus."""
    p = ctypes.create_string_buffer(struct.pack("<QI4x", flags, 0), 16)
    uvm_ioctl(tools_fd, cmd, p)
    return status_at(p, 8)


class Tracker:
    """One tracker on its own nvidia-uvm-tools fd (queue mode, or counters when entries=0)."""

    def __init__(self, devdir: str, uvm_fd: int, entries: int, v2: bool = True) -> None:
        self.entry_size = 72 if v2 else 64
        self.entries = entries
        self.tools_fd = os.open(os.path.join(devdir, "nvidia-uvm-tools"), os.O_RDWR)
        qbytes = max(entries * self.entry_size, 1)
        # anonymous mappings: page-aligned, writable memory the "driver" writes into
        self.queue = mmap.mmap(-1, (qbytes + 4095) // 4096 * 4096)
        self.control = mmap.mmap(-1, 4096)
        self._q = ctypes.c_char.from_buffer(self.queue)
        self._c = ctypes.c_char.from_buffer(self.control)
        p = ctypes.create_string_buffer(INIT_PARAMS.pack(
            ctypes.addressof(self._q) if entries else 0, entries, ctypes.addressof(self._c),
            b"\0" * 16, 1, uvm_fd, 0xFFFFFFFF), 56)
        uvm_ioctl(self.tools_fd, INIT_EVENT_TRACKER_V2 if v2 else INIT_EVENT_TRACKER, p)
        self.status = status_at(p, 48)

    def control_words(self) -> tuple[int, int, int, int]:
        """(get_ahead, get_behind, put_ahead, put_behind)."""
        words: tuple[int, int, int, int] = struct.unpack_from("<IIII", self.control, 0)
        return words

    def dropped(self) -> list[int]:
        return list(struct.unpack_from("<64Q", self.control, 16))

    def counters(self) -> list[int]:
        return list(struct.unpack_from(f"<{TOTAL_COUNTERS}Q", self.control, 0))

    def drain(self) -> list[tuple[int, bytes]]:
        """Every record between get_behind and put_behind, as (queue index, raw bytes)."""
        out: list[tuple[int, bytes]] = []
        _, get, _, put = self.control_words()
        mask = self.entries - 1
        while get != put:
            off = get * self.entry_size
            out.append((get, bytes(self.queue[off:off + self.entry_size])))
            get = (get + 1) & mask
        struct.pack_into("<II", self.control, 0, get, get)
        return out

    def close(self) -> None:
        os.close(self.tools_fd)
        del self._q, self._c
        self.queue.close()
        self.control.close()
