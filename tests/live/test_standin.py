"""The TEST STAND-IN NVIDIA driver (tests/standin): build, mount, known workload, RM semantics.

These tests check the stand-in itself, so that tracer tests built on it can trust it.
They need root, /dev/fuse and libfuse3-dev, and skip with the reason otherwise.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.standin import standin

NO_MOUNT = standin.skip_reason()
NO_BUILD = standin.skip_reason(need_mount=False)
needs_mount = pytest.mark.skipif(NO_MOUNT is not None, reason=NO_MOUNT or "")
# Every test here needs the stand-in built or mounted: counted as live, so CI fails
# when they skip (tests/live_report.py).
pytestmark = [pytest.mark.live]

# ioctl words and layouts (driver 580), as in tests/standin/nvstandin.h
RM_ALLOC_NVOS21 = 0xC020462B
RM_ALLOC_NVOS64 = 0xC030462B
RM_FREE = 0xC0104629
RM_CONTROL = 0xC020462A
RM_ALLOC_MEMORY = 0xC0384627
RM_VID_HEAP_CONTROL = 0xC0B8464A
XFER_CMD = 0xC01046D3
UVM_INITIALIZE = 0x30000001
UVM_REGISTER_GPU = 37
NVOS21 = struct.Struct("<IIIIQII")  # hRoot hObjectParent hObjectNew hClass pAllocParms size status
NVOS64 = struct.Struct("<IIIIQQIII4x")  # ... pRightsRequested paramsSize flags status
NVOS00 = struct.Struct("<IIII")
NVOS02_FD = struct.Struct("<IIIII4xQQI4xi4x")
# NVOS32: header, then data.AllocSize up to `address`, then the rest of the 144-byte union
NVOS32 = struct.Struct("<IIIIh2xIQQ" "IIIIIIIIIII4xQQQQQ" "56x")
NV_OK = 0
NV_ERR_ILLEGAL_ACTION = 0x16
NV_ERR_INSERT_DUPLICATE_NAME = 0x19
NV_ERR_INVALID_OBJECT_HANDLE = 0x33
NV_ERR_NO_MEMORY = 0x51
MIB = 1 << 20


@pytest.fixture
def dev(tmp_path: Path) -> Iterator[Path]:
    with standin.mounted_driver(tmp_path, budget=1 << 30, gpus=2) as d:
        yield d


def _ioctl(fd: int, cmd: int, packer: struct.Struct, *fields: int) -> tuple[int, ...]:
    buf = bytearray(packer.pack(*fields))
    fcntl.ioctl(fd, cmd, buf)
    return packer.unpack(bytes(buf))


def _alloc_client(ctl: int) -> int:
    _, _, h, cls, _, _, status = _ioctl(ctl, RM_ALLOC_NVOS21, NVOS21, 0, 0, 0, 0, 0, 0, 0)
    assert (status, cls) == (NV_OK, 0x41)
    assert h != 0
    return h


def _alloc64(ctl: int, client: int, parent: int, h: int, cls: int, params: int = 0) -> int:
    out = _ioctl(ctl, RM_ALLOC_NVOS64, NVOS64, client, parent, h, cls, params, 0, 0, 0, 0)
    return out[8]


def _mem_params(size: int) -> ctypes.Array[ctypes.c_char]:
    """NV_MEMORY_ALLOCATION_PARAMS (128 bytes) with `size` at offset 64."""
    p = ctypes.create_string_buffer(128)
    struct.pack_into("<Q", p, 64, size)
    return p


_libc = ctypes.CDLL(None, use_errno=True)


def _ioctl_ptr(fd: int, cmd: int, buf: ctypes.Array[ctypes.c_char]) -> int:
    """ioctl with a raw pointer, as UVM callers pass it (fcntl.ioctl takes only a C int)."""
    rc: int = _libc.ioctl(fd, ctypes.c_ulong(cmd), ctypes.c_void_p(ctypes.addressof(buf)))
    return rc


def _free(ctl: int, client: int, h: int) -> int:
    return _ioctl(ctl, RM_FREE, NVOS00, client, 0, h, 0xFFFFFFFF)[3]


@pytest.mark.skipif(NO_BUILD is not None, reason=NO_BUILD or "")
def test_print_expected_matches_expected_json() -> None:
    assert standin.expected() == standin.load_expected_json()


def test_expected_json_counts() -> None:
    """The numbers tracer tests rely on; a change here must be deliberate."""
    e = standin.load_expected_json()
    assert e["ioctls_by_device"] == {
        "ctl": {"RM_ALLOC": 12, "RM_FREE": 6, "RM_CONTROL": 3, "RM_MAP_MEMORY": 1,
                "RM_UNMAP_MEMORY": 1, "RM_DUP_OBJECT": 1},
        "gpu": {"RM_ALLOC_MEMORY": 1},
        "uvm": {name: 1 for name in (
            "UVM_INITIALIZE", "UVM_MM_INITIALIZE", "UVM_REGISTER_GPU",
            "UVM_REGISTER_GPU_VASPACE", "UVM_CREATE_EXTERNAL_RANGE",
            "UVM_MAP_EXTERNAL_ALLOCATION", "UVM_FREE", "UVM_MIGRATE",
            "UVM_ALLOC_SEMAPHORE_POOL", "UVM_SET_PREFERRED_LOCATION", "UVM_SET_ACCESSED_BY",
            "UVM_PAGEABLE_MEM_ACCESS")},
    }
    assert e["ioctls_total"] == 37
    assert e["failing_allocations"] == 1
    sizes = [(a["class"], a["size"], a["status"]) for a in e["memory_allocations"]]
    assert sizes == [
        (0x40, 2 * MIB, 0), (0x40, 64 * MIB, 0), (0x40, 4 * MIB, 0), (0x40, 32 * MIB, 0),
        (0x3E, 1 * MIB, 0), (0x3E, 128 << 10, 0), (0x50A0, 256 * MIB, 0),
        (0x40, 1 << 40, NV_ERR_NO_MEMORY), (0x71, 64 << 10, 0), (0x40, 64 * MIB, 0),
    ]
    assert e["unfreed_memory_objects"]["count"] == 4
    assert e["unfreed_memory_objects"]["bytes"] == 96 * MIB + (128 << 10) + 256 * MIB


@pytest.mark.skipif(NO_BUILD is not None, reason=NO_BUILD or "")
def test_print_expected_scales_with_repeat() -> None:
    e3 = standin.expected("--repeat", "3", "--no-exit-free")
    assert e3["ioctls"]["RM_ALLOC"] == 4 + 3 * 8
    assert e3["ioctls"]["RM_FREE"] == 3 * 5
    assert e3["unfreed_memory_objects"]["count"] == 12
    assert len(e3["memory_allocations"]) == 30


@needs_mount
def test_files_and_workload(dev: Path) -> None:
    names = sorted(os.listdir(dev))
    assert names == [".state", "nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidia1",
                     "nvidiactl"]
    r = standin.run_workload(dev)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "DONE\n"
    st = standin.wait_state(dev, lambda s: s.scalars["clients"] == 0)
    assert st.scalars["clients"] == 0
    assert st.scalars["objects"] == 0
    assert st.gpus[0]["used"] == 0
    assert st.gpus[0]["failed"] == 1
    assert st.gpus[0]["peak"] == standin.load_expected_json()["budget_bytes"]["min"]


@needs_mount
def test_no_exit_free_close_frees_everything(dev: Path) -> None:
    r = standin.run_workload(dev, "--repeat", "3", "--no-exit-free")
    assert r.stdout == "DONE\n"
    st = standin.wait_state(dev, lambda s: s.scalars["clients"] == 0)
    assert (st.scalars["clients"], st.scalars["objects"], st.gpus[0]["used"]) == (0, 0, 0)
    assert st.scalars["uvm_ranges"] == 0
    assert st.gpus[0]["failed"] == 3


@needs_mount
def test_concurrent_workloads_keep_separate_clients(dev: Path) -> None:
    with standin.waiting_workload(dev) as a, standin.waiting_workload(dev, "--repeat", "2") as b:
        st = standin.read_state(dev)
        assert sorted(c["pid"] for c in st.clients) == sorted([a.pid, b.pid])
        assert len({c["handle"] for c in st.clients}) == 2
        rb = b.go()
        ra = a.go()
    assert (ra[0], ra[1]) == (0, "DONE\n"), ra[2]
    assert (rb[0], rb[1]) == (0, "DONE\n"), rb[2]
    st = standin.wait_state(dev, lambda s: s.scalars["clients"] == 0)
    assert st.scalars["objects"] == 0


@needs_mount
def test_budget_exceeded_and_unknown_handles(dev: Path) -> None:
    ctl = os.open(dev / "nvidiactl", os.O_RDWR)
    try:
        client = _alloc_client(ctl)
        assert _alloc64(ctl, client, client, 0x100, 0x80) == NV_OK
        assert _alloc64(ctl, client, client, 0x100, 0x80) == NV_ERR_INSERT_DUPLICATE_NAME
        ok = _mem_params(512 * MIB)
        assert _alloc64(ctl, client, 0x100, 0x200, 0x40, ctypes.addressof(ok)) == NV_OK
        # OUT fields written into the caller's NV_MEMORY_ALLOCATION_PARAMS
        assert struct.unpack_from("<Q", ok, 88)[0] == 512 * MIB - 1
        big = _mem_params(768 * MIB)  # 512 + 768 MiB > the 1 GiB budget
        assert _alloc64(ctl, client, 0x100, 0x201, 0x40, ctypes.addressof(big)) == NV_ERR_NO_MEMORY
        assert _alloc64(ctl, client, 0x999, 0x202, 0x40, ctypes.addressof(ok)) == \
            NV_ERR_INVALID_OBJECT_HANDLE
        assert _alloc64(ctl, 0x12345678, 0x100, 0x203, 0x80) == NV_ERR_INVALID_OBJECT_HANDLE
        assert _free(ctl, client, 0x201) == NV_ERR_INVALID_OBJECT_HANDLE
        assert standin.read_state(dev).gpus[0]["used"] == 512 * MIB
        # freeing the device frees the memory below it
        assert _free(ctl, client, 0x100) == NV_OK
        st = standin.read_state(dev)
        assert (st.scalars["objects"], st.gpus[0]["used"]) == (1, 0)
        # a client left behind is freed when nvidiactl closes
        assert _alloc64(ctl, client, client, 0x100, 0x80) == NV_OK
    finally:
        os.close(ctl)
    st = standin.wait_state(dev, lambda s: s.scalars["clients"] == 0)
    assert st.scalars["objects"] == 0


@needs_mount
def test_budget_is_per_gpu(dev: Path) -> None:
    ctl = os.open(dev / "nvidiactl", os.O_RDWR)
    try:
        client = _alloc_client(ctl)
        dev1 = ctypes.create_string_buffer(struct.pack("<I", 1), 56)  # NV0080 deviceId = 1
        assert _alloc64(ctl, client, client, 0x100, 0x80, ctypes.addressof(dev1)) == NV_OK
        dev9 = ctypes.create_string_buffer(struct.pack("<I", 9), 56)  # no such GPU
        assert _alloc64(ctl, client, client, 0x101, 0x80, ctypes.addressof(dev9)) != NV_OK
        p = _mem_params(3 * MIB)
        assert _alloc64(ctl, client, 0x100, 0x200, 0x40, ctypes.addressof(p)) == NV_OK
        st = standin.read_state(dev)
        assert [g["used"] for g in st.gpus] == [0, 3 * MIB]
        obj = next(o for o in st.objects if o["handle"] == 0x200)
        assert (obj["class"], obj["gpu"], obj["kind"], obj["size"]) == (0x40, 1, "vid", 3 * MIB)
    finally:
        os.close(ctl)


@needs_mount
def test_vid_heap_control(dev: Path) -> None:
    ctl = os.open(dev / "nvidiactl", os.O_RDWR)
    try:
        client = _alloc_client(ctl)
        assert _alloc64(ctl, client, client, 0x100, 0x80) == NV_OK
        alloc = [client, 0x100, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                 5 * MIB, 0, 0, 0, 0]
        out = _ioctl(ctl, RM_VID_HEAP_CONTROL, NVOS32, *alloc)
        status, h_memory, size, limit = out[5], out[9], out[19], out[22]
        assert (status, size, limit) == (NV_OK, 5 * MIB, 5 * MIB - 1)
        assert out[7] == (1 << 30) - 5 * MIB  # free
        assert standin.read_state(dev).gpus[0]["used"] == 5 * MIB
        free = [client, 0x100, 3, 0, 0, 0, 0, 0, 0, h_memory] + [0] * 14
        assert _ioctl(ctl, RM_VID_HEAP_CONTROL, NVOS32, *free)[5] == NV_OK
        assert standin.read_state(dev).gpus[0]["used"] == 0
    finally:
        os.close(ctl)


@needs_mount
def test_device_node_rules_and_xfer(dev: Path) -> None:
    ctl = os.open(dev / "nvidiactl", os.O_RDWR)
    gpu = os.open(dev / "nvidia1", os.O_RDWR)
    try:
        client = _alloc_client(ctl)
        # RM_ALLOC_MEMORY only on /dev/nvidiaN, RM_ALLOC only on nvidiactl
        fields = (client, client, 0x300, 0x71, 0, 0x1000, 0xFFF, 0xFFFFFFFF, -1)
        with pytest.raises(OSError) as exc:
            _ioctl(ctl, RM_ALLOC_MEMORY, NVOS02_FD, *fields)
        assert exc.value.errno == errno.EINVAL
        assert _ioctl(gpu, RM_ALLOC_MEMORY, NVOS02_FD, *fields)[7] == NV_OK
        with pytest.raises(OSError):
            _ioctl(gpu, RM_ALLOC_NVOS64, NVOS64, client, client, 0x301, 0x80, 0, 0, 0, 0, 0)
        # NV_ESC_IOCTL_XFER_CMD: RM_FREE wrapped, its params behind a pointer
        inner = ctypes.create_string_buffer(NVOS00.pack(client, client, 0x300, 0xFFFFFFFF))
        xfer = struct.Struct("<IIQ")
        _ioctl(ctl, XFER_CMD, xfer, 0x29, NVOS00.size, ctypes.addressof(inner))
        assert NVOS00.unpack(inner.raw[:16])[3] == NV_OK
        assert _free(ctl, client, 0x300) == NV_ERR_INVALID_OBJECT_HANDLE
    finally:
        os.close(gpu)
        os.close(ctl)


@needs_mount
def test_uvm_status_written_into_caller_struct(dev: Path) -> None:
    uvm = os.open(dev / "nvidia-uvm", os.O_RDWR)
    try:
        reg = ctypes.create_string_buffer(40)
        struct.pack_into("<i", reg, 24, -1)
        assert _ioctl_ptr(uvm, UVM_REGISTER_GPU, reg) == 0
        assert struct.unpack_from("<I", reg, 36)[0] == NV_ERR_ILLEGAL_ACTION  # before INITIALIZE
        ini = ctypes.create_string_buffer(16)
        struct.pack_into("<I", ini, 8, 0xDEADBEEF)
        assert _ioctl_ptr(uvm, UVM_INITIALIZE, ini) == 0
        assert struct.unpack_from("<I", ini, 8)[0] == NV_OK
        assert _ioctl_ptr(uvm, UVM_REGISTER_GPU, reg) == 0
        assert struct.unpack_from("<I", reg, 36)[0] == NV_OK
    finally:
        os.close(uvm)


@needs_mount
def test_small_budget_makes_workload_fail(tmp_path: Path) -> None:
    e = standin.load_expected_json()
    with standin.mounted_driver(tmp_path, budget=e["budget_bytes"]["min"] - 1) as d:
        r = standin.run_workload(d, check=False)
    assert r.returncode == 1
    assert "RM_ALLOC memory status: got 0x51" in r.stderr


def test_expected_json_is_json() -> None:
    json.loads(standin.EXPECTED_JSON.read_text())
