"""Decoders compared field by field with independent truth.

- UVM parameter layouts per driver version (gputrace/record/driver_version.py) against a
  table transcribed here from docs/driver-facts.md §1.3 (latest
  595) and §1.4 (layout drift), and against the FUSE stand-in's own table of
  rmStatus offsets at 580 (tests/standin/nvstandin.h, UVM_CMD_TABLE).
- Every record kind (ioctl, mapping, fd, cuda, fault) decoded from raw structs whose
  every field holds a non-trivial value (GPU 0, 1 and -1; every valid bit on and off;
  each UVM command; RM_VID_HEAP_CONTROL allocs and frees), compared with values
  computed here from the inputs, not by the decoder's helpers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gputrace.record import decode
from gputrace.record import driver_version as driver
from gputrace.record.api import decode as decode_cuda
from gputrace.record.cpu_faults import decode as decode_faults
from gputrace.record.driver_version import NOFF, UvmLayout, parse_version, rm_defines, uvm_layouts

ROOT = Path(__file__).resolve().parents[3]
FIELDS = ("status", "base", "length", "offset", "uuid", "ref_fd", "h_client", "h_object",
          "flags")


# ===================================================================== UVM layouts
@dataclass(frozen=True)
class Want:
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


# facts §1.3: the latest layouts (595.45.04), command -> offsets of what is decoded
LATEST: dict[int, Want] = {
    0x30000001: Want(8, flags=0, flags_size=8),                 # INITIALIZE
    0x30000002: Want(None),                                     # DEINITIALIZE
    75: Want(4, ref_fd=0),                                      # MM_INITIALIZE
    37: Want(36, uuid=0, ref_fd=24, h_client=28),               # REGISTER_GPU
    38: Want(16, uuid=0),                                       # UNREGISTER_GPU
    25: Want(28, uuid=0, ref_fd=16, h_client=20, h_object=24),  # REGISTER_GPU_VASPACE
    26: Want(16, uuid=0),                                       # UNREGISTER_GPU_VASPACE
    27: Want(48, uuid=0, ref_fd=16, h_client=20, h_object=24, base=32, length=40),
    28: Want(8, h_client=0, h_object=4),                        # UNREGISTER_CHANNEL
    23: Want(8),                                                # CREATE_RANGE_GROUP
    24: Want(8),                                                # DESTROY_RANGE_GROUP
    31: Want(24, base=8, length=16),                            # SET_RANGE_GROUP
    73: Want(16, base=0, length=8),                             # CREATE_EXTERNAL_RANGE
    33: Want(9260, base=0, length=8, offset=16, ref_fd=9248, h_client=9252, h_object=9256),
    74: Want(32, base=0, length=8, uuid=16),                    # MAP_EXTERNAL_SPARSE
    66: Want(32, base=0, length=8, uuid=16),                    # UNMAP_EXTERNAL
    34: Want(8, base=0),                                        # FREE
    80: Want(24, base=0, length=8, flags=16, flags_size=8),     # DISCARD
    51: Want(72, base=0, length=8, uuid=16, flags=32),          # MIGRATE
    53: Want(24, uuid=8),                                       # MIGRATE_RANGE_GROUP
    68: Want(9240, base=0, length=8),                           # ALLOC_SEMAPHORE_POOL
    78: Want(52, base=0, length=8, offset=16, uuid=24, ref_fd=40, h_client=44, h_object=48),
    39: Want(4, flags=0, flags_size=1),                         # PAGEABLE_MEM_ACCESS
    70: Want(20, uuid=0, flags=16, flags_size=1),               # PAGEABLE_MEM_ACCESS_ON_GPU
    71: Want(20, base=0, length=8, flags=16),                   # POPULATE_PAGEABLE
    72: Want(16, base=0, length=8),                             # VALIDATE_VA_RANGE
    42: Want(36, base=0, length=8, uuid=16),                    # SET_PREFERRED_LOCATION
    43: Want(16, base=0, length=8),                             # UNSET_PREFERRED_LOCATION
    46: Want(32, base=0, length=8, uuid=16),                    # SET_ACCESSED_BY
    47: Want(32, base=0, length=8, uuid=16),                    # UNSET_ACCESSED_BY
    44: Want(16, base=0, length=8),                             # ENABLE_READ_DUPLICATION
    45: Want(16, base=0, length=8),                             # DISABLE_READ_DUPLICATION
    29: Want(32, uuid=0),                                       # ENABLE_PEER_ACCESS
    30: Want(32, uuid=0),                                       # DISABLE_PEER_ACCESS
    65: Want(32, base=0, length=8, uuid=16),                    # MAP_DYNAMIC_PARALLELISM_REGION
    67: Want(0),                                                # TOOLS_FLUSH_EVENTS
    69: Want(0),                                                # CLEAN_UP_ZOMBIE_RESOURCES
}


def want_layouts(v: tuple[int, int, int]) -> dict[int, Want]:
    """facts §1.4 applied backwards from the latest layouts (and §1.2's "from" tags)."""
    w = dict(LATEST)
    big = v >= (550, 54, 14) or (550, 40, 53) <= v < (550, 41, 0)
    if not big:  # perGpuAttributes had 32 entries
        w[33] = Want(1196, base=0, length=8, offset=16, ref_fd=1184, h_client=1188,
                     h_object=1192)
        w[68] = Want(1176, base=0, length=8)
    if v < (550, 40, 7):  # no preferredCpuNumaNode yet
        w[42] = Want(32, base=0, length=8, uuid=16)
    if v < (590, 44, 1):  # FREE still had length; UNREGISTER_CHANNEL its gpuUuid
        w[34] = Want(16, base=0, length=8)
        w[28] = Want(24, uuid=0, h_client=16, h_object=20)
    if v < (565, 57, 1):
        del w[78]  # ALLOC_DEVICE_P2P from 565.57.01
    if v < (580, 65, 6):
        del w[80]  # DISCARD from 580.65.06
    return w


VERSIONS = ["535.43.02", "545.29.06", "550.40.07", "550.40.53", "550.54.14", "555.42.02",
            "565.57.01", "570.86.15", "575.51.02", "580.65.06", "580.142", "590.44.01",
            "595.45.04"]


def _got(lay: UvmLayout) -> Want:
    return Want(lay.status, lay.base, lay.length, lay.offset, lay.uuid, lay.ref_fd,
                lay.h_client, lay.h_object, lay.flags, lay.flags_size)


@pytest.mark.parametrize("version", VERSIONS)
def test_uvm_layouts_match_the_facts(version: str) -> None:
    """Every decoded command of every layout version: every offset, status included."""
    v = parse_version(version)
    got = {lay.cmd: _got(lay) for lay in uvm_layouts(v)}
    want = want_layouts(v)
    assert sorted(got) == sorted(want)
    for cmd in sorted(want):
        assert got[cmd] == want[cmd], f"{version} {driver.UVM_NAMES[cmd]}"


def _standin_status_offsets() -> dict[int, int | None]:
    text = (ROOT / "tests" / "standin" / "nvstandin.h").read_text()
    out: dict[int, int | None] = {}
    for cmd, _name, _size, status in re.findall(
            r'X\((\w+), "(\w+)", (\d+), (\w+), \d\)', text):
        c = {"UVM_INITIALIZE": 0x30000001, "UVM_DEINITIALIZE": 0x30000002}.get(cmd)
        out[c if c is not None else int(cmd)] = None if status == "UINT32_MAX" else int(status)
    return out


def test_uvm_status_offsets_match_the_stand_in_driver() -> None:
    """A second source: the stand-in writes rmStatus at its table's offsets (580)."""
    from tests.standin.standin import DRIVER_VERSION

    table = _standin_status_offsets()
    assert len(table) > 40
    for lay in uvm_layouts(parse_version(DRIVER_VERSION)):
        assert lay.status == table[lay.cmd], driver.UVM_NAMES[lay.cmd]


def test_layout_tuple_fills_the_bpf_struct_in_order() -> None:
    """as_tuple -> struct uvm_layout (UVM_LAYOUT_DTYPE) field by field, NOFF for absent."""
    lay = UvmLayout(51, status=72, base=0, length=8, uuid=16, flags=32)
    rec = np.array([lay.as_tuple()], dtype=decode.UVM_LAYOUT_DTYPE)[0]
    assert {n: int(rec[n]) for n in decode.UVM_LAYOUT_DTYPE.names or ()} == {
        "status": 72, "base": 0, "length": 8, "offset": NOFF, "uuid": 16, "ref_fd": NOFF,
        "h_client": NOFF, "h_object": NOFF, "flags": 32, "flags_size": 4, "known": 1,
        "span_lo": 0, "span_len": 76}
    assert driver.slot(driver.UVM_INITIALIZE) == 126 and driver.slot(51) == 51


@pytest.mark.parametrize(("fields", "span"), [
    # every field within one window: from the first byte of the first to the last of the last
    ({"status": 72, "base": 0, "length": 8, "uuid": 16, "flags": 32}, (0, 76)),
    ({"status": 24, "base": 8, "length": 16}, (8, 20)),
    # MAP_EXTERNAL_ALLOCATION (550+): base/length/offset at 0..24, the handles and the
    # status 9 KiB on: the window holds the four at the end, the three others alone
    ({"status": 9260, "base": 0, "length": 8, "offset": 16, "ref_fd": 9248,
      "h_client": 9252, "h_object": 9256}, (9248, 16)),
    # a tie of two windows of two fields: the shorter one
    ({"status": 400, "base": 0, "length": 8, "h_client": 200, "h_object": 204}, (200, 8)),
    # one field, or fields farther apart than SPAN_MAX: each read alone
    ({"status": 8}, (0, 0)),
    ({"status": 200, "base": 0}, (0, 0)),
    # a field that would end past the window is not inside it
    ({"status": 0, "uuid": 120}, (0, 0)),
    ({"status": 0, "uuid": 112}, (0, 128)),
    ({"status": 4, "flags": 0, "flags_size": 1}, (0, 8)),
])  # fmt: skip
def test_layout_span_takes_the_most_fields_in_one_read(fields: dict[str, int],
                                                       span: tuple[int, int]) -> None:  # fmt: skip
    """UvmLayout.span: the probe's one read (GT_UVM_SPAN bytes at most) covers the
    window holding the most fields, the shortest on a tie."""
    assert driver.SPAN_MAX == 128
    assert UvmLayout(51, **fields).span() == span


@pytest.mark.parametrize(("version", "nvos21", "nvos64_40"), [
    ("515.43.04", 24, 32), ("520.61.05", 24, 32), ("525.47.04", 24, 36),
    ("530.30.02", 24, 36), ("535.43.02", 28, 36), ("580.142", 28, 36)])
def test_rm_status_offsets_by_version(version: str, nvos21: int, nvos64_40: int) -> None:
    """facts §2.3: NVOS21 status @24 before 535.43.02 (paramsSize took it), @28 after;
    40-byte NVOS64 status @32 up to 520, @36 for 525-530."""
    assert rm_defines(parse_version(version)) == {
        "GT_NVOS21_STATUS_OFF": nvos21, "GT_NVOS64_40_STATUS_OFF": nvos64_40}


# ===================================================================== record kinds
# GT_V_* bits of ioctl_event.valid, transcribed from probes/gputrace_events.h
V = {"status": 0, "h_client": 1, "h_parent": 2, "h_object": 3, "h_class": 4, "size_bytes": 5,
     "va_base": 6, "va_length": 7, "offset": 8, "alignment": 9, "flags": 10, "attr": 11,
     "attr2": 12, "ctrl_cmd": 13, "ref_fd": 14, "gpu_uuid": 15}
DEVICES = {1: "ctl", 2: "gpu", 3: "uvm", 4: "uvm-tools"}
RM_VID_HEAP_CONTROL = 0x4A


def _uuid_text(raw: bytes) -> str:
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _ioctl(i: int, *, device: int, gpu: int, nr: int, valid: set[str],
           **over: Any) -> dict[str, Any]:
    """One raw event with every field distinct and non-zero (unless overridden)."""
    raw: dict[str, Any] = {
        "ts_ns": 1_000_000_000_000 + 1000 * i, "latency_ns": 1500 + i, "ret": 0,
        "size_bytes": (3 << 20) + i, "va_base": 0x7F0000000000 + (i << 21),
        "va_length": (2 << 20) * (i + 1), "offset": 0x1000 * (i + 1), "alignment": 0x10000,
        "pid": 4000 + i, "tid": 5000 + i, "fd": 3 + i, "cmd": 0xC0000000 | nr, "nr": nr,
        "status": 0x51 + i, "h_client": 0xC1D00000 + i, "h_parent": 0x5C000000 + i,
        "h_object": 0x5C010000 + i, "h_class": 0x40 + i, "flags": 0x4000 + i,
        "attr": 0x100 + i, "attr2": 0x200 + i, "ctrl_cmd": 0x20801300 + i, "ref_fd": 7 + i,
        "valid": sum(1 << V[n] for n in valid),
        "uuid": bytes(range(16 * i, 16 * i + 16)) if i < 15 else bytes(16),
        "comm": f"proc{i % 3}".encode(), "device": device, "gpu_index": gpu,
    }
    raw.update(over)
    return raw


def _expected_ioctl(raw: dict[str, Any], name: str) -> dict[str, Any]:
    out = {
        "ts_ns": raw["ts_ns"], "pid": raw["pid"], "tid": raw["tid"],
        "comm": raw["comm"].decode(), "device_code": raw["device"],
        "device": DEVICES[raw["device"]], "gpu_index": raw["gpu_index"]
        if raw["gpu_index"] >= 0 else None, "fd": raw["fd"], "cmd": raw["cmd"],
        "nr": raw["nr"], "name": name, "ret": raw["ret"], "latency_ns": raw["latency_ns"],
    }
    for col, bit in V.items():
        on = bool(raw["valid"] & (1 << bit))
        if col == "gpu_uuid":
            out[col] = _uuid_text(raw["uuid"]) if on else None
        else:
            out[col] = raw[col] if on else None
    return out


ALL_RM = set(V) - {"gpu_uuid"}


def _ioctl_cases() -> list[tuple[dict[str, Any], str]]:
    cases = [
        (_ioctl(0, device=1, gpu=-1, nr=0x2B, valid=ALL_RM), "RM_ALLOC"),
        (_ioctl(1, device=2, gpu=0, nr=0x27, valid={"status", "h_client", "size_bytes"}),
         "RM_ALLOC_MEMORY"),
        (_ioctl(2, device=2, gpu=1, nr=0x27, valid={"status", "h_object"}), "RM_ALLOC_MEMORY"),
        # RM_VID_HEAP_CONTROL as the probe fills it: function 2 alloc, 3 free
        (_ioctl(3, device=1, gpu=-1, nr=RM_VID_HEAP_CONTROL, ctrl_cmd=2,
                valid={"h_client", "h_parent", "ctrl_cmd", "status", "h_object", "flags",
                       "attr", "size_bytes", "alignment", "offset", "va_base"}),
         "RM_VID_HEAP_CONTROL"),
        (_ioctl(4, device=1, gpu=-1, nr=RM_VID_HEAP_CONTROL, ctrl_cmd=3,
                valid={"h_client", "h_parent", "ctrl_cmd", "status", "h_object", "flags"}),
         "RM_VID_HEAP_CONTROL"),
        (_ioctl(5, device=1, gpu=-1, nr=0x99, valid=set(), ret=-22), "NV_ESC_0x99"),
        (_ioctl(6, device=4, gpu=-1, nr=76, valid={"status"}), "UVM_TOOLS_INIT_EVENT_TRACKER_V2"),
        (_ioctl(7, device=3, gpu=-1, nr=0x63, valid=set()), "UVM_0x63"),
        (_ioctl(8, device=2, gpu=0, nr=0xD7, valid=set()), "NUMA_INFO"),
    ]
    # every UVM command of the latest layout table, with the fields its layout holds
    for k, (cmd, want) in enumerate(sorted(want_layouts(parse_version("595.45.04")).items())):
        valid = {"status"} if want.status is not None else set()
        valid |= {c for c, f in (("va_base", want.base), ("va_length", want.length),
                                 ("offset", want.offset), ("gpu_uuid", want.uuid),
                                 ("ref_fd", want.ref_fd), ("h_client", want.h_client),
                                 ("h_object", want.h_object), ("flags", want.flags))
                  if f is not None}
        cases.append((_ioctl(9 + k, device=3, gpu=-1, nr=cmd, valid=valid),
                      driver.UVM_NAMES[cmd]))
    return cases


def _raw_array(rows: list[dict[str, Any]], dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    ev = np.zeros(len(rows), dtype)
    for i, r in enumerate(rows):
        for k, v in r.items():
            ev[i][k] = np.frombuffer(v, np.uint8) if k == "uuid" else v
    return ev


def test_ioctl_events_decode_field_by_field() -> None:
    cases = _ioctl_cases()
    raw = [c[0] for c in cases]
    # reverse the time order: the decoder must sort
    ev = _raw_array(raw[::-1], decode.IOCTL_DTYPE)
    batch = decode.ioctls_batch(ev)
    assert batch.schema.names == [c.name for c in decode.schema.IOCTLS.columns]
    got = batch.to_pylist()
    want = [_expected_ioctl(r, name) for r, name in cases]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        for col in w:
            assert g[col] == w[col], (w["name"], col, g[col], w[col])


def test_ioctl_gpu_index_0_1_and_absent() -> None:
    """GPU 0 is a GPU, not a missing value; -1 is missing."""
    ev = _raw_array([_ioctl(i, device=2, gpu=g, nr=0x27, valid=set())
                     for i, g in enumerate((0, 1, -1, 0, 7))], decode.IOCTL_DTYPE)
    assert decode.ioctls_batch(ev).column("gpu_index").to_pylist() == [0, 1, None, 0, 7]


def test_ioctl_batches_split_and_join() -> None:
    """Count-prefixed batches of 1, 3 and 0 events give the events back in order."""
    rows = [_ioctl(i, device=1, gpu=-1, nr=0x29, valid={"status"}) for i in range(4)]
    ev = _raw_array(rows, decode.IOCTL_DTYPE)
    raw = b""
    for part in (ev[:1], ev[1:], ev[:0]):
        raw += len(part).to_bytes(4, "little") + b"\0" * 4 + part.tobytes()
    got = decode.ioctl_events_from_batches(raw)
    assert got.tobytes() == ev.tobytes()
    assert decode.ioctl_events(ev.tobytes()).tobytes() == ev.tobytes()


def test_mapping_events_decode_field_by_field() -> None:
    rows = [  # managed mmap of uvm (offset == addr), failed mmap, munmap, mmap of nvidia1
        {"ts_ns": 30, "latency_ns": 900, "addr": 0x7E0000000000, "length": 64 << 20,
         "offset": 0x7E0000000000, "ret": 0x7E0000000000, "pid": 11, "tid": 12, "prot": 3,
         "flags": 0x11, "fd": 4, "op": 1, "device": 3, "gpu_index": -1, "comm": b"m"},
        {"ts_ns": 10, "latency_ns": 800, "addr": 0x1000, "length": 4096, "offset": 0x2000,
         "ret": -12, "pid": 11, "tid": 13, "prot": 1, "flags": 0x1, "fd": 5, "op": 1,
         "device": 2, "gpu_index": 0, "comm": b"m"},
        {"ts_ns": 20, "latency_ns": 700, "addr": 0x7E0000000000, "length": 2 << 20,
         "offset": 0, "ret": 0, "pid": 11, "tid": 11, "prot": 0, "flags": 0, "fd": -1,
         "op": 2, "device": 0, "gpu_index": -1, "comm": b"other"},
        {"ts_ns": 40, "latency_ns": 600, "addr": 0x7F00000000, "length": 8192,
         "offset": 0x3000, "ret": 0x7F00000000, "pid": 14, "tid": 14, "prot": 3,
         "flags": 0x1, "fd": 6, "op": 1, "device": 2, "gpu_index": 1, "comm": b"g"},
    ]
    got = decode.mappings_batch(_raw_array(rows, decode.MAPPING_DTYPE)).to_pylist()
    want = [
        {"ts_ns": 10, "pid": 11, "tid": 13, "comm": "m", "op_code": 1, "op": "mmap",
         "device_code": 2, "device": "gpu", "gpu_index": 0, "fd": 5, "addr": None,
         "length": 4096, "offset": 0x2000, "prot": 1, "flags": 1, "ret": -12,
         "managed": False, "latency_ns": 800},
        {"ts_ns": 20, "pid": 11, "tid": 11, "comm": "other", "op_code": 2, "op": "munmap",
         "device_code": 0, "device": "unknown", "gpu_index": None, "fd": -1,
         "addr": 0x7E0000000000, "length": 2 << 20, "offset": None, "prot": None,
         "flags": None, "ret": 0, "managed": False, "latency_ns": 700},
        {"ts_ns": 30, "pid": 11, "tid": 12, "comm": "m", "op_code": 1, "op": "mmap",
         "device_code": 3, "device": "uvm", "gpu_index": None, "fd": 4,
         "addr": 0x7E0000000000, "length": 64 << 20, "offset": 0x7E0000000000, "prot": 3,
         "flags": 0x11, "ret": 0x7E0000000000, "managed": True, "latency_ns": 900},
        {"ts_ns": 40, "pid": 14, "tid": 14, "comm": "g", "op_code": 1, "op": "mmap",
         "device_code": 2, "device": "gpu", "gpu_index": 1, "fd": 6, "addr": 0x7F00000000,
         "length": 8192, "offset": 0x3000, "prot": 3, "flags": 1, "ret": 0x7F00000000,
         "managed": False, "latency_ns": 600},
    ]
    assert got == want


def test_fd_events_decode_field_by_field() -> None:
    rows = [
        {"ts_ns": 5, "ret": 9, "pid": 21, "tid": 22, "fd": 9, "new_fd": -1, "op": 1,
         "device": 2, "gpu_index": 0, "valid": 1, "comm": b"a"},
        {"ts_ns": 6, "ret": 12, "pid": 21, "tid": 21, "fd": 9, "new_fd": 12, "op": 3,
         "device": 2, "gpu_index": 0, "valid": 1, "comm": b"a"},
        {"ts_ns": 7, "ret": 0, "pid": 23, "tid": 23, "fd": 4, "new_fd": -1, "op": 2,
         "device": 2, "gpu_index": 1, "valid": 1, "comm": b"b"},
        {"ts_ns": 8, "ret": 0, "pid": 23, "tid": 24, "fd": 3, "new_fd": -1, "op": 2,
         "device": 1, "gpu_index": -1, "valid": 0, "comm": b"b"},
    ]
    got = decode.files_batch(_raw_array(rows, decode.FD_DTYPE)).to_pylist()
    want = [
        {"ts_ns": 5, "pid": 21, "tid": 22, "comm": "a", "fd_op_code": 1, "fd_op": "open",
         "device_code": 2, "device": "gpu", "gpu_index": 0, "fd": 9, "new_fd": None, "ret": 9},
        {"ts_ns": 6, "pid": 21, "tid": 21, "comm": "a", "fd_op_code": 3, "fd_op": "dup",
         "device_code": 2, "device": "gpu", "gpu_index": 0, "fd": 9, "new_fd": 12, "ret": 12},
        {"ts_ns": 7, "pid": 23, "tid": 23, "comm": "b", "fd_op_code": 2, "fd_op": "close",
         "device_code": 2, "device": "gpu", "gpu_index": 1, "fd": 4, "new_fd": None, "ret": 0},
        {"ts_ns": 8, "pid": 23, "tid": 24, "comm": "b", "fd_op_code": 2, "fd_op": "close",
         "device_code": 1, "device": "ctl", "gpu_index": None, "fd": 3, "new_fd": None,
         "ret": None},
    ]
    assert got == want


# GT_CV_* bits of cuda_event.valid
CV = {"size_bytes": 0, "ptr": 1, "handle": 2, "flags": 3, "stream": 4}


def test_cuda_events_decode_field_by_field() -> None:
    names = {1: "cuMemAlloc_v2", 2: "cuMemFree_v2", 3: "cuMemCreate"}
    rows = []
    for i in range(8):
        valid = i * 5 % 32  # 0, 5, 10, 15, 20, 25, 30, 3: every bit on and off
        rows.append({"ts_ns": 100 - i, "latency_ns": 10 + i, "size_bytes": (1 << 20) * (i + 1),
                     "ptr": 0x7F0000000000 + i, "handle": 0x55000000 + i, "flags": 0x10 + i,
                     "stream": 0x9000 + i, "pid": 31 + i % 2, "tid": 40 + i,
                     "result": (0, 2, 1, 0, 0, 999, 0, 0)[i], "stack_id": (-1, 0, 5)[i % 3],
                     "py_stack_id": -1,  # not a Python thread: the stack id is the native one
                     "func": 1 + i % 3, "valid": valid, "comm": b"cu%d" % (i % 2)})
    got = decode_cuda.cuda_calls_batch(_raw_array(rows, decode_cuda.CUDA_DTYPE), names)
    got_rows = got.to_pylist()
    want = []
    for r in sorted(rows, key=lambda r: r["ts_ns"]):
        w = {"ts_ns": r["ts_ns"], "pid": r["pid"], "tid": r["tid"], "comm": r["comm"].decode(),
             "func": names[r["func"]], "result": r["result"], "latency_ns": r["latency_ns"],
             "stack_id": None if r["stack_id"] < 0 else r["stack_id"]}
        for col, bit in CV.items():
            w[col] = r[col] if r["valid"] & (1 << bit) else None
        want.append(w)
    assert got.schema.names == [c.name for c in decode.schema.CUDA_CALLS.columns]
    assert got_rows == [{k: g[k] for k in w} for g, w in zip(got_rows, want, strict=True)]
    assert got_rows == want


def test_fault_events_decode_field_by_field() -> None:
    rows = [{"ts_ns": 50 - i, "address": 0x300000000000 + i * 0x1FF000 + 0x40,
             "ip": 0x401000 + i, "pid": 61 + i % 2, "tid": 70 + i,
             "error_code": (0x4, 0x6, 0x7, 0x5, 0x2)[i], "comm": b"f%d" % i}
            for i in range(5)]
    got = decode_faults.faults_batch(_raw_array(rows, decode_faults.FAULT_DTYPE)).to_pylist()
    want = []
    for r in sorted(rows, key=lambda r: r["ts_ns"]):
        write = bool(r["error_code"] & 2)
        want.append({"ts_ns": r["ts_ns"], "pid": r["pid"], "tid": r["tid"],
                     "comm": r["comm"].decode(), "source_code": 1, "source": "cpu",
                     "gpu_index": None, "address": r["address"],
                     "block_2m": r["address"] // (2 << 20) * (2 << 20),
                     "fault_type_code": 255, "fault_type": "unknown",
                     "access_type_code": 2 if write else 1,
                     "access_type": "write" if write else "read", "instances": None,
                     "batch_id": None, "ip": r["ip"]})
    for g, w in zip(got, want, strict=True):
        assert {k: g[k] for k in w} == w
        # columns a CPU fault cannot fill (GPU-side fields) stay null
        assert all(g[k] is None for k in g if k not in w)
