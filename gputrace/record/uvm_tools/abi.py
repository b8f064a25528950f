"""The UVM tools ABI: command numbers, status codes, event and counter numbering, the
parameter structs of each driver generation, and which of them a driver version
wants (`tools_abi`).

Layouts and the ABI choice by driver version: docs/driver-facts.md §1.3-1.4 and
§5.2-5.3; the driver's own source (`uvm_tools.c`) for the table sizes. Struct
sizes and offsets are pinned by tests/unit/record/test_uvm_tools_client.py. Used by the
tracker client (`uvm_tools`); nothing here touches a device.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

from gputrace.record.driver_version import Version
from gputrace.record.uvm_tools.records import ENTRY_SIZE

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


class ToolsError(Exception):
    """A tracker could not be set up; `str(err)` is the reason for the manifest."""


# --- parameter structs (x86-64; sizes pinned by tests/unit/record/test_uvm_tools_client.py) ---
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
