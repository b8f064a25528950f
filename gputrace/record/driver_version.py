"""NVIDIA driver version detection and the version-dependent layouts.

The version comes from the host (`/sys/module/nvidia_uvm/version`,
`/sys/module/nvidia/version`, `/proc/driver/nvidia/version`) or from
`--driver-version`. From it, this module chooses the UVM parameter layouts
(BPF map entries, `uvm_layouts`) and the RM status offsets of the historic
NVOS21/NVOS64 sizes (-D defines). Offsets: docs/driver-facts.md §1.3-1.4, §2.3.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from gputrace.errors import UsageError
from gputrace.nvabi import UVM_DEINITIALIZE, UVM_INITIALIZE

LATEST = "595.45.04"
"""Layouts assumed when no driver is loaded and no --driver-version is given."""

_VERSION_RE = re.compile(r"^(\d{3})\.(\d{1,3})(?:\.(\d{1,3}))?$")
_SOURCES = (
    "/sys/module/nvidia_uvm/version",
    "/sys/module/nvidia/version",
    "/proc/driver/nvidia/version",
)

Version = tuple[int, int, int]

NOFF = 0xFFFF


def parse_version(text: str) -> Version:
    """'550.54.14' -> (550, 54, 14); raises UsageError for anything else."""
    m = _VERSION_RE.match(text.strip())
    if not m:
        raise UsageError(
            f"bad --driver-version {text!r}: expected a driver version like 550.54.14"
        )
    major = int(m.group(1))
    if not 400 <= major <= 999:
        raise UsageError(f"bad --driver-version {text!r}: major version {major} is not known")
    return (major, int(m.group(2)), int(m.group(3) or 0))


def detect_version(root: str = "/") -> str | None:
    """The loaded driver's version string, or None when no driver is loaded."""
    for src in _SOURCES:
        p = Path(root) / src.lstrip("/")
        try:
            text = p.read_text(errors="replace")
        except OSError:
            continue
        m = re.search(r"(\d{3}\.\d{1,3}(?:\.\d{1,3})?)", text)
        if m:
            return m.group(1)
    return None


SPAN_MAX = 128
"""GT_UVM_SPAN: the most bytes of a command's parameters the probe reads in one go."""
# bytes of each offset field of UvmLayout but flags (flags_size): status, base, length,
# offset, uuid, ref_fd, h_client, h_object, as the probe reads them
_FIELD_BYTES = (4, 8, 8, 8, 16, 4, 4, 4)


@dataclass(frozen=True)
class UvmLayout:
    """Byte offsets of the fields decoded for one UVM command (None = absent)."""

    cmd: int
    status: int | None
    base: int | None = None
    length: int | None = None
    offset: int | None = None
    uuid: int | None = None
    ref_fd: int | None = None
    h_client: int | None = None
    h_object: int | None = None
    flags: int | None = None
    flags_size: int = 4

    def _offsets(self) -> tuple[int | None, ...]:
        return (self.status, self.base, self.length, self.offset, self.uuid, self.ref_fd,
                self.h_client, self.h_object, self.flags)  # fmt: skip

    def span(self) -> tuple[int, int]:
        """(lo, len): the bytes the probe reads in one go, a field inside them then
        taken from that copy (each user read costs about the same whatever its size):
        the window of at most SPAN_MAX bytes that holds the most fields, the shortest
        such; (0, 0) where no window holds two (each field is read alone)."""
        sizes = (*_FIELD_BYTES, self.flags_size)
        fields = [(o, n) for o, n in zip(self._offsets(), sizes, strict=True) if o is not None]
        best = (1, 0, 0)  # (fields inside, -len, lo): a window must hold two
        for lo, _n in fields:
            inside = [o + n for o, n in fields if lo <= o and o + n <= lo + SPAN_MAX]
            best = max(best, (len(inside), lo - max(inside), lo))
        count, neg_len, lo = best
        return (lo, -neg_len) if count > 1 else (0, 0)

    def as_tuple(self) -> tuple[int, ...]:
        """Values in the field order of `struct uvm_layout` (gputrace_events.h)."""
        offs = self._offsets()
        return (*(NOFF if o is None else o for o in offs), self.flags_size, 1, *self.span())


SLOT_INITIALIZE = 126
SLOT_DEINITIALIZE = 127

UVM_NAMES: dict[int, str] = {
    23: "UVM_CREATE_RANGE_GROUP", 24: "UVM_DESTROY_RANGE_GROUP",
    25: "UVM_REGISTER_GPU_VASPACE", 26: "UVM_UNREGISTER_GPU_VASPACE",
    27: "UVM_REGISTER_CHANNEL", 28: "UVM_UNREGISTER_CHANNEL",
    29: "UVM_ENABLE_PEER_ACCESS", 30: "UVM_DISABLE_PEER_ACCESS",
    31: "UVM_SET_RANGE_GROUP", 33: "UVM_MAP_EXTERNAL_ALLOCATION", 34: "UVM_FREE",
    35: "UVM_MEM_MAP", 37: "UVM_REGISTER_GPU", 38: "UVM_UNREGISTER_GPU",
    39: "UVM_PAGEABLE_MEM_ACCESS", 40: "UVM_PREVENT_MIGRATION_RANGE_GROUPS",
    41: "UVM_ALLOW_MIGRATION_RANGE_GROUPS", 42: "UVM_SET_PREFERRED_LOCATION",
    43: "UVM_UNSET_PREFERRED_LOCATION", 44: "UVM_ENABLE_READ_DUPLICATION",
    45: "UVM_DISABLE_READ_DUPLICATION", 46: "UVM_SET_ACCESSED_BY",
    47: "UVM_UNSET_ACCESSED_BY", 51: "UVM_MIGRATE", 53: "UVM_MIGRATE_RANGE_GROUP",
    54: "UVM_ENABLE_SYSTEM_WIDE_ATOMICS", 55: "UVM_DISABLE_SYSTEM_WIDE_ATOMICS",
    56: "UVM_TOOLS_INIT_EVENT_TRACKER", 57: "UVM_TOOLS_SET_NOTIFICATION_THRESHOLD",
    58: "UVM_TOOLS_EVENT_QUEUE_ENABLE_EVENTS", 59: "UVM_TOOLS_EVENT_QUEUE_DISABLE_EVENTS",
    60: "UVM_TOOLS_ENABLE_COUNTERS", 61: "UVM_TOOLS_DISABLE_COUNTERS",
    62: "UVM_TOOLS_READ_PROCESS_MEMORY", 63: "UVM_TOOLS_WRITE_PROCESS_MEMORY",
    64: "UVM_TOOLS_GET_PROCESSOR_UUID_TABLE", 65: "UVM_MAP_DYNAMIC_PARALLELISM_REGION",
    66: "UVM_UNMAP_EXTERNAL", 67: "UVM_TOOLS_FLUSH_EVENTS", 68: "UVM_ALLOC_SEMAPHORE_POOL",
    69: "UVM_CLEAN_UP_ZOMBIE_RESOURCES", 70: "UVM_PAGEABLE_MEM_ACCESS_ON_GPU",
    71: "UVM_POPULATE_PAGEABLE", 72: "UVM_VALIDATE_VA_RANGE",
    73: "UVM_CREATE_EXTERNAL_RANGE", 74: "UVM_MAP_EXTERNAL_SPARSE", 75: "UVM_MM_INITIALIZE",
    76: "UVM_TOOLS_INIT_EVENT_TRACKER_V2", 77: "UVM_TOOLS_GET_PROCESSOR_UUID_TABLE_V2",
    78: "UVM_ALLOC_DEVICE_P2P", 79: "UVM_CLEAR_ALL_ACCESS_COUNTERS", 80: "UVM_DISCARD",
    UVM_INITIALIZE: "UVM_INITIALIZE", UVM_DEINITIALIZE: "UVM_DEINITIALIZE",
}  # fmt: skip


def _ge(v: Version, *ref: int) -> bool:
    return v >= tuple(ref)


def uvm_layouts(v: Version) -> list[UvmLayout]:
    """The decoded UVM commands and their offsets for driver version `v`."""
    big_gpus = _ge(v, 550, 54, 14) or ((550, 40, 53) <= v < (550, 41, 0))
    L = UvmLayout
    out = [
        L(UVM_INITIALIZE, status=8, flags=0, flags_size=8),
        L(UVM_DEINITIALIZE, status=None),
        L(75, status=4, ref_fd=0),  # MM_INITIALIZE
        L(37, status=36, uuid=0, ref_fd=24, h_client=28),  # REGISTER_GPU
        L(38, status=16, uuid=0),  # UNREGISTER_GPU
        L(25, status=28, uuid=0, ref_fd=16, h_client=20, h_object=24),  # REGISTER_GPU_VASPACE
        L(26, status=16, uuid=0),  # UNREGISTER_GPU_VASPACE
        L(27, status=48, uuid=0, ref_fd=16, h_client=20, h_object=24, base=32, length=40),
        L(73, status=16, base=0, length=8),  # CREATE_EXTERNAL_RANGE
        L(66, status=32, base=0, length=8, uuid=16),  # UNMAP_EXTERNAL
        L(74, status=32, base=0, length=8, uuid=16),  # MAP_EXTERNAL_SPARSE
        L(51, status=72, base=0, length=8, uuid=16, flags=32),  # MIGRATE
        L(39, status=4, flags=0, flags_size=1),  # PAGEABLE_MEM_ACCESS
        L(70, status=20, uuid=0, flags=16, flags_size=1),  # PAGEABLE_MEM_ACCESS_ON_GPU
        L(46, status=32, base=0, length=8, uuid=16),  # SET_ACCESSED_BY
        L(47, status=32, base=0, length=8, uuid=16),  # UNSET_ACCESSED_BY
        L(43, status=16, base=0, length=8),  # UNSET_PREFERRED_LOCATION
        L(44, status=16, base=0, length=8),  # ENABLE_READ_DUPLICATION
        L(45, status=16, base=0, length=8),  # DISABLE_READ_DUPLICATION
        L(72, status=16, base=0, length=8),  # VALIDATE_VA_RANGE
        L(71, status=20, base=0, length=8, flags=16),  # POPULATE_PAGEABLE
        L(23, status=8),  # CREATE_RANGE_GROUP
        L(24, status=8),  # DESTROY_RANGE_GROUP
        L(31, status=24, base=8, length=16),  # SET_RANGE_GROUP
        L(53, status=24, uuid=8),  # MIGRATE_RANGE_GROUP
        L(29, status=32, uuid=0),  # ENABLE_PEER_ACCESS
        L(30, status=32, uuid=0),  # DISABLE_PEER_ACCESS
        L(65, status=32, base=0, length=8, uuid=16),  # MAP_DYNAMIC_PARALLELISM_REGION
        L(67, status=0),  # TOOLS_FLUSH_EVENTS
        L(69, status=0),  # CLEAN_UP_ZOMBIE_RESOURCES
        L(
            33,
            status=9260 if big_gpus else 1196,
            base=0,
            length=8,
            offset=16,
            ref_fd=9248 if big_gpus else 1184,
            h_client=9252 if big_gpus else 1188,
            h_object=9256 if big_gpus else 1192,
        ),  # MAP_EXTERNAL_ALLOCATION
        L(68, status=9240 if big_gpus else 1176, base=0, length=8),  # ALLOC_SEMAPHORE_POOL
        L(
            42, status=36 if _ge(v, 550, 40, 7) else 32, base=0, length=8, uuid=16
        ),  # SET_PREFERRED_LOCATION
    ]
    if _ge(v, 590, 44, 1):
        out.append(L(34, status=8, base=0))  # FREE: length removed
        out.append(L(28, status=8, h_client=0, h_object=4))  # UNREGISTER_CHANNEL
    else:
        out.append(L(34, status=16, base=0, length=8))
        out.append(L(28, status=24, uuid=0, h_client=16, h_object=20))
    if _ge(v, 565, 57, 1):
        out.append(L(78, status=52, base=0, length=8, offset=16, uuid=24, ref_fd=40,
                     h_client=44, h_object=48))  # fmt: skip
    if _ge(v, 580, 65, 6):
        out.append(L(80, status=24, base=0, length=8, flags=16, flags_size=8))  # DISCARD
    return out


def slot(cmd: int) -> int:
    if cmd == UVM_INITIALIZE:
        return SLOT_INITIALIZE
    if cmd == UVM_DEINITIALIZE:
        return SLOT_DEINITIALIZE
    if not 0 <= cmd < SLOT_INITIALIZE:
        raise ValueError(f"UVM command {cmd:#x} has no layout slot")
    return cmd


def rm_defines(v: Version) -> dict[str, int]:
    """-D defines for the RM decoders (status offsets of historic struct sizes)."""
    return {
        "GT_NVOS21_STATUS_OFF": 28 if _ge(v, 535, 43, 2) else 24,
        "GT_NVOS64_40_STATUS_OFF": 32 if v < (525, 0, 0) else 36,
    }


@dataclass
class DriverInfo:
    version: str | None  # detected or given; None when unknown
    layout_version: str  # the version whose layouts are used
    source: str  # "host", "option" or "assumed"
    layouts: list[UvmLayout] = field(default_factory=list)
    defines: dict[str, int] = field(default_factory=dict)


def resolve(option: str | None, root: str = "/") -> DriverInfo:
    """Pick the version (option > host > latest) and its layouts."""
    if option is not None:
        v, src, ver = parse_version(option), "option", option
    else:
        found = detect_version(root)
        if found is not None:
            try:
                v, src, ver = parse_version(found), "host", found
            except UsageError:
                v, src, ver = parse_version(LATEST), "assumed", None
        else:
            v, src, ver = parse_version(LATEST), "assumed", None
    text = ver if ver is not None else LATEST
    return DriverInfo(ver, text, src, uvm_layouts(v), rm_defines(v))
