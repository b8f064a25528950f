"""Client of the driver's own UVM tools interface: event and counter trackers on
another process's UVM file, with no kernel probe.

For one target process this module takes the target's `/dev/nvidia-uvm` fd
(through `fdtake`: only a file checked to be the UVM device ever reaches the
recorder), opens `nvidia-uvm-tools` twice (an event queue tracker and a
counter tracker), and drains the queue in bulk: the records are copied out as
bytes, at most two copies per drain (wrap-around), never one object per event.
The ABI (command numbers, parameter structs, the choice by driver version) is in
`uvm_tools_abi`; processor UUIDs are mapped to trace GPUs by `gpu_uuids`.

The tracker and the duplicated fd both hold a reference on the target's UVM file:
while either is open the driver cannot tear down that process's VA space and
free its GPU memory, so `Tracker.close()` must run as soon as the target exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
from collections.abc import Sequence
from dataclasses import dataclass

from gputrace.record.fdtake import FdTaker, TakeError, device_identity
from gputrace.record.libc import (
    LIBC,
    MADV_DONTFORK,
    MAP_FAILED,
    MAP_PRIVATE_ANON,
    PAGE,
    PROT_RW,
    ioctl,
    pidfd_open,
)
from gputrace.record.uvm_tools.abi import (
    COUNTER_FLAGS,
    EVENT_FLAGS,
    MAX_PROCESSORS,
    NUM_EVENT_TYPES,
    NV_OK,
    TOOLS_ENABLE_COUNTERS,
    TOOLS_EVENT_QUEUE_ENABLE_EVENTS,
    TOOLS_FLUSH_EVENTS,
    TOTAL_COUNTERS,
    UUID_LEN,
    ControlData,
    FlagsParams,
    InitParamsNegotiated,
    InitParamsVersioned,
    StatusParams,
    ToolsAbi,
    ToolsError,
    UuidTableParamsNegotiated,
    UuidTableParamsVersioned,
)

DEFAULT_QUEUE_ENTRIES = 65_536


class Pinned:
    """Page-aligned anonymous memory the driver pins (queue, control page, table).

    MADV_DONTFORK: the recorder forks its command; a child sharing these pages
    copy-on-write could leave the parent reading a copy the driver no longer writes.
    """

    def __init__(self, size: int) -> None:
        self.size = max(PAGE, -(-size // PAGE) * PAGE)
        addr = LIBC.mmap(None, self.size, PROT_RW, MAP_PRIVATE_ANON, -1, 0)
        if addr is None or addr == MAP_FAILED:
            e = ctypes.get_errno()
            raise ToolsError(f"mmap of {self.size} bytes: {os.strerror(e)}")
        self.addr: int = addr
        LIBC.madvise(self.addr, self.size, MADV_DONTFORK)

    def close(self) -> None:
        if self.addr:
            LIBC.munmap(self.addr, self.size)
            self.addr = 0



def uvm_identity(devdir: str) -> str:
    """The identity (`fdtake.device_identity`) of `<devdir>/nvidia-uvm`; ToolsError."""
    try:
        return device_identity(os.path.join(devdir, "nvidia-uvm"))
    except TakeError as e:
        raise ToolsError(str(e)) from None


def uvm_fds(pid: int, devdir: str) -> list[int]:
    """The target's fds on `<devdir>/nvidia-uvm`, lowest first."""
    want = os.path.join(os.path.abspath(devdir), "nvidia-uvm")
    base = f"/proc/{pid}/fd"
    out = []
    try:
        names = os.listdir(base)
    except OSError:
        return []
    for name in names:
        with contextlib.suppress(OSError):
            if os.readlink(f"{base}/{name}") == want:
                out.append(int(name))
    return sorted(out)


# --- the event queue --------------------------------------------------------------
class EventQueue:
    """The ring the driver writes records into, and its control page.

    `drain()` copies the records in [get, put_behind) as bytes (two copies when
    the ring wraps), then publishes the new get index to the driver.
    """

    def __init__(self, entries: int, entry_size: int) -> None:
        if entries < 2 or entries & (entries - 1):
            raise ToolsError(f"queue entries must be a power of two >= 2, not {entries}")
        self.entries = entries
        self.entry_size = entry_size
        self.buffer = Pinned(entries * entry_size)
        self.control_mem = Pinned(ctypes.sizeof(ControlData))
        self.control = ControlData.from_address(self.control_mem.addr)
        self._get = 0

    def drain(self) -> bytes:
        c, es, n = self.control, self.entry_size, self.entries
        put = c.put_behind & (n - 1)
        get = self._get
        if put == get:
            return b""
        base = self.buffer.addr
        if put > get:
            data = ctypes.string_at(base + get * es, (put - get) * es)
        else:
            data = ctypes.string_at(base + get * es, (n - get) * es)
            if put:
                data += ctypes.string_at(base, put * es)
        # The driver tests fullness against get_behind: publish both, as the
        # driver's own consumers do.
        c.get_ahead = put
        c.get_behind = put
        self._get = put
        return data

    def dropped(self) -> list[int]:
        """Cumulative per-type counts of records the driver dropped (queue full)."""
        return list(self.control.dropped)

    def close(self) -> None:
        self.buffer.close()
        self.control_mem.close()


@dataclass
class Attached:
    """What `Tracker.open` found out, for the manifest."""

    pid: int
    target_fd: int
    abi: str
    version: int
    queue_entries: int
    counters: bool
    counters_error: str | None = None


class Tracker:
    """The event and counter trackers on one target process's UVM file."""

    def __init__(self, pid: int, abi: ToolsAbi) -> None:
        self.pid = pid
        self.abi = abi
        self.pidfd = -1
        self.uvm_fd = -1
        self.tools_fd = -1
        self.counter_fd = -1
        self.queue: EventQueue | None = None
        self.counter_mem: Pinned | None = None
        self.table = Pinned(MAX_PROCESSORS * UUID_LEN)
        self.info: Attached | None = None
        self.closed = False

    # -- setup
    @classmethod
    def open(
        cls,
        pid: int,
        devdir: str,
        abi: ToolsAbi,
        queue_entries: int = DEFAULT_QUEUE_ENTRIES,
        fds: Sequence[int] | None = None,
        taker: FdTaker | None = None,
    ) -> Tracker:
        """Attach to `pid` (its uvm fds from /proc unless `fds` is given); ToolsError.
        `taker` takes the fds (a helper of its own, for this call, when None)."""
        t = cls(pid, abi)
        own = None
        try:
            if taker is None:
                taker = own = FdTaker(uvm_identity(devdir))
            t._open(devdir, queue_entries, fds, taker)
        except BaseException:
            t.close()
            raise
        finally:
            if own is not None:
                own.close()
        return t

    def _open(self, devdir: str, entries: int, fds: Sequence[int] | None,
              taker: FdTaker) -> None:  # fmt: skip
        candidates = list(fds) if fds is not None else uvm_fds(self.pid, devdir)
        if not candidates:
            raise ToolsError(f"pid {self.pid} has no {devdir.rstrip('/')}/nvidia-uvm fd open")
        try:
            self.pidfd = pidfd_open(self.pid)
        except OSError as e:
            raise ToolsError(f"pidfd_open({self.pid}): {e.strerror}") from None
        tools_path = os.path.join(devdir, "nvidia-uvm-tools")
        self.queue = EventQueue(entries, self.abi.entry_size)
        reasons = []
        # A process may hold several uvm fds (the MM_INITIALIZE one, or an fd of
        # a library that never initialized): the driver refuses those with
        # NV_ERR_ILLEGAL_ACTION, so try each until one takes a tracker. The fd
        # number is the target's to reuse: what is there now is checked (fdtake).
        for fd in candidates:
            try:
                dup = taker.take(self.pidfd, fd)
            except TakeError as e:
                reasons.append(str(e))
                continue
            try:
                tools = os.open(tools_path, os.O_RDWR | os.O_CLOEXEC)
            except OSError as e:
                os.close(dup)
                raise ToolsError(f"open {tools_path}: {e.strerror}") from None
            status = self._init(tools, dup, self.queue.buffer.addr, entries,
                                self.queue.control_mem.addr)  # fmt: skip
            if status is None:
                self.uvm_fd, self.tools_fd = dup, tools
                break
            os.close(tools)
            os.close(dup)
            reasons.append(f"fd {fd}: {status}")
        else:
            raise ToolsError("tracker init failed: " + "; ".join(reasons))
        self._enable(self.tools_fd, TOOLS_EVENT_QUEUE_ENABLE_EVENTS, EVENT_FLAGS, "enable events")
        self.info = Attached(self.pid, fd, self.abi.name, self.abi.version, entries, False)
        self._open_counters(tools_path)

    def _init(self, tools: int, uvm: int, queue: int, entries: int, control: int) -> str | None:
        """One INIT_EVENT_TRACKER; None on success, else the reason."""
        p = self.abi.init_params()
        p.queueBuffer, p.queueBufferSize, p.controlBuffer = queue, entries, control
        p.allProcessors, p.uvmFd = 1, uvm
        if isinstance(p, InitParamsNegotiated):
            p.requestedVersion = self.abi.version
        elif isinstance(p, InitParamsVersioned):
            p.version = self.abi.version
        try:
            ioctl(tools, self.abi.init_cmd, p)
        except OSError as e:
            return f"ioctl {self.abi.init_cmd}: {e.strerror}"
        if p.rmStatus != NV_OK:
            return f"rmStatus {p.rmStatus:#x}"
        if isinstance(p, InitParamsNegotiated) and entries and p.grantedVersion != self.abi.version:
            return f"driver granted queue version {p.grantedVersion}, not {self.abi.version}"
        return None

    def _enable(self, fd: int, cmd: int, flags: int, what: str) -> None:
        p = FlagsParams(flags=flags)
        try:
            ioctl(fd, cmd, p)
        except OSError as e:
            raise ToolsError(f"{what}: {e.strerror}") from None
        if p.rmStatus != NV_OK:
            raise ToolsError(f"{what}: rmStatus {p.rmStatus:#x}")

    def _open_counters(self, tools_path: str) -> None:
        """The counter tracker: optional, its failure is noted, not fatal."""
        assert self.info is not None
        try:
            fd = os.open(tools_path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as e:
            self.info.counters_error = f"open {tools_path}: {e.strerror}"
            return
        self.counter_mem = Pinned(TOTAL_COUNTERS * 8)
        why = self._init(fd, self.uvm_fd, 0, 0, self.counter_mem.addr)
        if why is None:
            try:
                self._enable(fd, TOOLS_ENABLE_COUNTERS, COUNTER_FLAGS, "enable counters")
            except ToolsError as e:
                why = str(e)
        if why is not None:
            os.close(fd)
            self.counter_mem.close()
            self.counter_mem = None
            self.info.counters_error = why
            return
        self.counter_fd = fd
        self.info.counters = True

    # -- running
    def drain(self) -> bytes:
        return self.queue.drain() if self.queue is not None else b""

    def dropped(self) -> list[int]:
        return self.queue.dropped() if self.queue is not None else [0] * NUM_EVENT_TYPES

    def counters(self) -> list[int] | None:
        """The 10 `UvmCounterName` totals, or None without a counter tracker."""
        if self.counter_mem is None:
            return None
        return list((ctypes.c_uint64 * TOTAL_COUNTERS).from_address(self.counter_mem.addr))

    def flush(self) -> None:
        """Have the driver push records it still holds (FLUSH_EVENTS, on the uvm fd)."""
        if self.uvm_fd >= 0:
            with contextlib.suppress(OSError):
                ioctl(self.uvm_fd, TOOLS_FLUSH_EVENTS, StatusParams())

    def processors(self) -> list[bytes] | None:
        """The processor UUID table (index 0 = CPU; all-zero = unused), or None."""
        if self.uvm_fd < 0:
            return None
        ctypes.memset(self.table.addr, 0, self.table.size)
        p = self.abi.uuid_params()
        p.tablePtr = self.table.addr
        if isinstance(p, UuidTableParamsNegotiated):
            p.count = MAX_PROCESSORS
        elif isinstance(p, UuidTableParamsVersioned):
            p.version = self.abi.version
        try:
            ioctl(self.uvm_fd, self.abi.uuid_cmd, p)
        except OSError:
            return None
        if p.rmStatus != NV_OK:
            return None
        raw = ctypes.string_at(self.table.addr, MAX_PROCESSORS * UUID_LEN)
        return [raw[i : i + UUID_LEN] for i in range(0, len(raw), UUID_LEN)]

    def exited(self) -> bool:
        """Has the target exited? (its pidfd reads as readable)"""
        if self.pidfd < 0:
            return True
        r, _, _ = select.select([self.pidfd], [], [], 0)
        return bool(r)

    def close(self) -> None:
        """Release the trackers, the duplicated uvm fd and the pidfd, then the memory.

        The fds go first: the driver unpins the queue pages on release, and the
        memory must outlive the pin.
        """
        for name in ("tools_fd", "counter_fd", "uvm_fd", "pidfd"):
            fd = getattr(self, name)
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
                setattr(self, name, -1)
        if self.queue is not None:
            self.queue.close()
            self.queue = None
        if self.counter_mem is not None:
            self.counter_mem.close()
            self.counter_mem = None
        self.table.close()
        self.closed = True


__all__ = ["DEFAULT_QUEUE_ENTRIES", "EventQueue", "ToolsError", "Tracker", "uvm_fds",
           "uvm_identity"]
