"""Client of the driver's own UVM tools interface: event and counter trackers on
another process's UVM file, with no kernel probe.

For one target process this module takes the target's `/dev/nvidia-uvm` fd with
`pidfd_getfd(2)`, opens `nvidia-uvm-tools` twice (an event queue tracker and a
counter tracker), and drains the queue in bulk: the records are copied out as
bytes, at most two copies per drain (wrap-around), never one object per event.
Layouts and the ABI choice by driver version: nvidia-driver-facts.md §1.3-1.4 and
§5.2-5.3; the driver's own source (`uvm_tools.c`) for the table sizes.

The tracker and the duplicated fd both hold a reference on the target's UVM file:
while either is open the driver cannot tear down that process's VA space and
free its GPU memory, so `Tracker.close()` must run as soon as the target exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import select
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gputrace.record.driver import Version

# --- UVM command numbers (plain integers on Linux; facts §1.2) -------------------
TOOLS_INIT_EVENT_TRACKER = 56
TOOLS_EVENT_QUEUE_ENABLE_EVENTS = 58
TOOLS_ENABLE_COUNTERS = 60
TOOLS_GET_PROCESSOR_UUID_TABLE = 64
TOOLS_FLUSH_EVENTS = 67
TOOLS_INIT_EVENT_TRACKER_V2 = 76
TOOLS_GET_PROCESSOR_UUID_TABLE_V2 = 77

NV_OK = 0
NV_ERR_INSUFFICIENT_PERMISSIONS = 0x1B
NV_ERR_ILLEGAL_ACTION = 0x1D

EVENT_TYPES: dict[int, str] = {
    1: "cpu_fault",
    2: "migration",
    3: "gpu_fault",
    4: "gpu_fault_replay",
    6: "fatal_fault",
    7: "read_duplicate",
    8: "read_duplicate_invalidate",
    10: "thrashing_detected",
    11: "throttling_start",
    12: "throttling_end",
    13: "map_remote",
}
"""`UvmEventType` values the recorder enables (facts §5.1), with the names used in drops."""

EVENT_FLAGS = sum(1 << t for t in EVENT_TYPES)
NUM_EVENT_TYPES = 64  # UvmEventNumTypesAll: the length of dropped[]

COUNTER_NAMES: dict[int, str] = {
    0: "bytes_xfer_htd",
    1: "bytes_xfer_dth",
    2: "cpu_page_fault_count",
    7: "prefetch_bytes_xfer_htd",
    8: "prefetch_bytes_xfer_dth",
    9: "gpu_page_fault_count",
}
"""`UvmCounterName` values that Linux drivers maintain (3-6 are Windows-only)."""

COUNTER_FLAGS = sum(1 << c for c in COUNTER_NAMES)
TOTAL_COUNTERS = 10  # UVM_TOTAL_COUNTERS

MAX_PROCESSORS = 257
"""Entries in the largest processor UUID table (UVM_ID_MAX_PROCESSORS since 550.54;
33 before). The buffer is always this long; older drivers fill only the front."""

UUID_LEN = 16
DEFAULT_QUEUE_ENTRIES = 65_536
ENTRY_SIZE = {1: 64, 2: 72}  # UvmEventEntry / UvmEventEntry_V2

SYS_PIDFD_GETFD = 438  # same number on x86-64 and the generic (arm64) table


class ToolsError(Exception):
    """A tracker could not be set up; `str(err)` is the reason for the manifest."""


# --- parameter structs (x86-64; sizes pinned by tests/test_uvm_tools_client.py) ---
# The fields every INIT_EVENT_TRACKER variant starts with; they differ only after uvmFd.
_INIT_PREFIX: list[tuple[str, Any]] = [
    ("queueBuffer", ctypes.c_uint64),
    ("queueBufferSize", ctypes.c_uint64),  # entries, a power of two; 0 = counters
    ("controlBuffer", ctypes.c_uint64),
    ("processor", ctypes.c_uint8 * UUID_LEN),
    ("allProcessors", ctypes.c_uint32),
    ("uvmFd", ctypes.c_uint32),
]


class InitParams(ctypes.Structure):
    """UVM_TOOLS_INIT_EVENT_TRACKER(_V2)_PARAMS, ≤550.40 and 565+ (56 bytes)."""

    _fields_ = [
        *_INIT_PREFIX,
        ("rmStatus", ctypes.c_uint32),
    ]


class InitParamsNegotiated(ctypes.Structure):
    """550.54.14-555.x: the queue version is negotiated in the params (64 bytes)."""

    _fields_ = [
        *_INIT_PREFIX,
        ("rmStatus", ctypes.c_uint32),
        ("requestedVersion", ctypes.c_uint32),
        ("grantedVersion", ctypes.c_uint32),
    ]


class InitParamsVersioned(ctypes.Structure):
    """560.x: one `version` field before rmStatus (56 bytes)."""

    _fields_ = [
        *_INIT_PREFIX,
        ("version", ctypes.c_uint32),
        ("rmStatus", ctypes.c_uint32),
    ]


class FlagsParams(ctypes.Structure):
    """EVENT_QUEUE_ENABLE_EVENTS / ENABLE_COUNTERS params (16 bytes)."""

    _fields_ = [("flags", ctypes.c_uint64), ("rmStatus", ctypes.c_uint32)]


class StatusParams(ctypes.Structure):
    """TOOLS_FLUSH_EVENTS params (4 bytes)."""

    _fields_ = [("rmStatus", ctypes.c_uint32)]


class UuidTableParams(ctypes.Structure):
    """GET_PROCESSOR_UUID_TABLE(_V2), 565+ (16 bytes)."""

    _fields_ = [("tablePtr", ctypes.c_uint64), ("rmStatus", ctypes.c_uint32)]


class UuidTableParamsCount(ctypes.Structure):
    """≤550.40: `count` OUT (16 bytes)."""

    _fields_ = [
        ("tablePtr", ctypes.c_uint64),
        ("count", ctypes.c_uint32),
        ("rmStatus", ctypes.c_uint32),
    ]


class UuidTableParamsNegotiated(ctypes.Structure):
    """550.54.14-555.x: `count` IN/OUT and `version` OUT (24 bytes)."""

    _fields_ = [
        ("tablePtr", ctypes.c_uint64),
        ("count", ctypes.c_uint32),
        ("rmStatus", ctypes.c_uint32),
        ("version", ctypes.c_uint32),
    ]


class UuidTableParamsVersioned(ctypes.Structure):
    """560.x: `version` IN (16 bytes)."""

    _fields_ = [
        ("tablePtr", ctypes.c_uint64),
        ("version", ctypes.c_uint32),
        ("rmStatus", ctypes.c_uint32),
    ]


class ControlData(ctypes.Structure):
    """UvmToolsEventControlData (528 bytes): ring indices and per-type drop counts."""

    _fields_ = [
        ("get_ahead", ctypes.c_uint32),
        ("get_behind", ctypes.c_uint32),
        ("put_ahead", ctypes.c_uint32),
        ("put_behind", ctypes.c_uint32),
        ("dropped", ctypes.c_uint64 * NUM_EVENT_TYPES),
    ]


# --- ABI choice -------------------------------------------------------------------
@dataclass(frozen=True)
class ToolsAbi:
    """How one driver release wants trackers set up, and the record format it gives."""

    name: str  # single | negotiated | version-field | separate-ioctls
    version: int  # queue record format: 1 (64-byte) or 2 (72-byte)
    init_cmd: int
    init_params: type[ctypes.Structure]
    uuid_cmd: int
    uuid_params: type[ctypes.Structure]
    cpu_fault_has_cpu_id: bool

    @property
    def entry_size(self) -> int:
        return ENTRY_SIZE[self.version]


def tools_abi(v: Version, queue_version: int | None = None) -> ToolsAbi:
    """The tools ABI of driver version `v` (facts §5.3, §1.4).

    `queue_version` asks for a queue record format other than the newest the
    driver offers: 1 (64-byte records) works on every driver, 2 (72-byte) from
    550.54.14 (550.40.53). From 565.57.01 the V1 queue has its own ioctl (56)
    and processor table (64, 33 entries); before, the version is a field of the
    init params.
    """
    if queue_version not in (None, 1, 2):
        raise ToolsError(f"UVM tools queue version must be 1 or 2, not {queue_version}")
    side_550 = (550, 40, 53) <= v < (550, 41, 0)
    uuid, init = TOOLS_GET_PROCESSOR_UUID_TABLE, TOOLS_INIT_EVENT_TRACKER
    qv = queue_version or 2
    if v >= (565, 57, 1):
        if qv == 1:
            return ToolsAbi("separate-ioctls", 1, init, InitParams, uuid, UuidTableParams, True)
        return ToolsAbi("separate-ioctls", 2, TOOLS_INIT_EVENT_TRACKER_V2, InitParams,
                        TOOLS_GET_PROCESSOR_UUID_TABLE_V2, UuidTableParams, True)  # fmt: skip
    if v >= (560, 0, 0):
        return ToolsAbi("version-field", qv, init, InitParamsVersioned,
                        uuid, UuidTableParamsVersioned, False)  # fmt: skip
    if v >= (550, 54, 14) or side_550:
        return ToolsAbi("negotiated", qv, init, InitParamsNegotiated,
                        uuid, UuidTableParamsNegotiated, False)  # fmt: skip
    if qv == 2 and queue_version is not None:
        raise ToolsError(f"driver {'.'.join(map(str, v))} has only the V1 (64-byte) tools queue")
    return ToolsAbi("single", 1, init, InitParams, uuid, UuidTableParamsCount, False)


# --- libc --------------------------------------------------------------------------
_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
_libc.ioctl.restype = ctypes.c_int
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]  # fmt: skip
_libc.mmap.restype = ctypes.c_void_p
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.syscall.restype = ctypes.c_long

_PROT_RW = 0x1 | 0x2
_MAP_PRIVATE_ANON = 0x02 | 0x20
_MADV_DONTFORK = 10
_MAP_FAILED = ctypes.c_void_p(-1).value
PAGE = os.sysconf("SC_PAGE_SIZE")


def ioctl(fd: int, cmd: int, params: ctypes.Structure) -> None:
    """Issue one ioctl with `params` in place; OSError when the syscall fails."""
    if _libc.ioctl(fd, cmd, ctypes.addressof(params)) < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


class Pinned:
    """Page-aligned anonymous memory the driver pins (queue, control page, table).

    MADV_DONTFORK: the recorder forks its command; a child sharing these pages
    copy-on-write could leave the parent reading a copy the driver no longer writes.
    """

    def __init__(self, size: int) -> None:
        self.size = max(PAGE, -(-size // PAGE) * PAGE)
        addr = _libc.mmap(None, self.size, _PROT_RW, _MAP_PRIVATE_ANON, -1, 0)
        if addr is None or addr == _MAP_FAILED:
            e = ctypes.get_errno()
            raise ToolsError(f"mmap of {self.size} bytes: {os.strerror(e)}")
        self.addr: int = addr
        _libc.madvise(self.addr, self.size, _MADV_DONTFORK)

    def close(self) -> None:
        if self.addr:
            _libc.munmap(self.addr, self.size)
            self.addr = 0


def pidfd_open(pid: int) -> int:
    return os.pidfd_open(pid)


def pidfd_getfd(pidfd: int, target_fd: int) -> int:
    """A duplicate, in this process, of fd `target_fd` of the process behind `pidfd`."""
    fd = _libc.syscall(SYS_PIDFD_GETFD, pidfd, target_fd, 0)
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return int(fd)


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
    ) -> Tracker:
        """Attach to `pid` (its uvm fds from /proc unless `fds` is given); ToolsError."""
        t = cls(pid, abi)
        try:
            t._open(devdir, queue_entries, fds)
        except BaseException:
            t.close()
            raise
        return t

    def _open(self, devdir: str, entries: int, fds: Sequence[int] | None) -> None:
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
        # NV_ERR_ILLEGAL_ACTION, so try each until one takes a tracker.
        for fd in candidates:
            try:
                dup = pidfd_getfd(self.pidfd, fd)
            except OSError as e:
                reasons.append(f"pidfd_getfd(fd {fd}): {e.strerror}")
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


def processor_map(table: Sequence[bytes] | None, gpu_uuids: dict[bytes, int]) -> dict[int, int]:
    """Tools processor index -> trace GPU index (CPU, index 0, -> -1).

    Processor indices are the driver's ids, not GPU numbers (the single H200 was
    index 1): a GPU maps through its UUID. A GPU whose UUID the trace does not
    know is left out, and the decoder reports its rows with no GPU.
    """
    out = {0: -1}
    if not table:
        return out
    for i, uuid in enumerate(table):
        if i == 0 or not any(uuid):
            continue
        gpu = gpu_uuids.get(bytes(uuid))
        if gpu is not None:
            out[i] = gpu
    return out


def unmapped(table: Iterable[bytes] | None, gpu_uuids: dict[bytes, int]) -> list[str]:
    """UUIDs of GPU processors in the table that no trace GPU has (for the manifest)."""
    if not table:
        return []
    return [format_uuid(u) for i, u in enumerate(table)
            if i and any(u) and bytes(u) not in gpu_uuids]  # fmt: skip


def format_uuid(raw: bytes) -> str:
    """16 bytes -> 'GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx', as nvidia-smi prints."""
    h = bytes(raw).hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def parse_uuid(text: str) -> bytes | None:
    """'GPU-xxxxxxxx-...' -> 16 bytes, or None when it is not a GPU UUID."""
    t = text.strip()
    if t.startswith(("GPU-", "MIG-")):
        t = t[4:]
    h = t.replace("-", "")
    if len(h) != 32:
        return None
    try:
        return bytes.fromhex(h)
    except ValueError:
        return None


__all__ = [
    "COUNTER_NAMES",
    "EVENT_TYPES",
    "ControlData",
    "EventQueue",
    "ToolsAbi",
    "ToolsError",
    "Tracker",
    "processor_map",
    "tools_abi",
]
