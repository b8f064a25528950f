"""The NVIDIA driver's numbers that gputrace relies on, in one place: RM escape
numbers and their names, RM object classes, the UVM commands a probe tests by value,
and the status codes reports interpret. What each means, and the driver tags they
were read from: docs/driver-facts.md (§1-2). Pure constants, importable everywhere
(the recorder, the analyses and the probes' -D defines read them from here;
tests/unit/record/test_bpf_defines.py checks the C side against them).
"""

from __future__ import annotations

NV_IOCTL_MAGIC = ord("F")
NV_IOCTL_BASE = 200
"""First OS-layer escape number (`C/nv-ioctl-numbers.h`)."""

# --- RM escapes (`nr` of `_IOWR('F', nr, size)`; §2.2) ---------------------------
ESC_RM_ALLOC_MEMORY = 0x27
ESC_RM_FREE = 0x29
ESC_RM_CONTROL = 0x2A
ESC_RM_ALLOC = 0x2B
ESC_RM_DUP_OBJECT = 0x34
ESC_RM_VID_HEAP_CONTROL = 0x4A
ESC_RM_MAP_MEMORY = 0x4E
ESC_RM_UNMAP_MEMORY = 0x4F
ESC_RM_MAP_MEMORY_DMA = 0x57
ESC_RM_UNMAP_MEMORY_DMA = 0x58
ESC_REGISTER_FD = NV_IOCTL_BASE + 1
ESC_CHECK_VERSION_STR = NV_IOCTL_BASE + 10
ESC_IOCTL_XFER_CMD = NV_IOCTL_BASE + 11
ESC_WAIT_OPEN_COMPLETE = NV_IOCTL_BASE + 18

RM_ESCAPE_NAMES: dict[int, str] = {
    ESC_RM_ALLOC_MEMORY: "RM_ALLOC_MEMORY", 0x28: "RM_ALLOC_OBJECT", ESC_RM_FREE: "RM_FREE",
    ESC_RM_CONTROL: "RM_CONTROL", ESC_RM_ALLOC: "RM_ALLOC", 0x32: "RM_CONFIG_GET",
    0x33: "RM_CONFIG_SET", ESC_RM_DUP_OBJECT: "RM_DUP_OBJECT",
    0x35: "RM_SHARE", 0x37: "RM_CONFIG_GET_EX", 0x38: "RM_CONFIG_SET_EX",
    0x39: "RM_I2C_ACCESS", 0x41: "RM_IDLE_CHANNELS", ESC_RM_VID_HEAP_CONTROL: "RM_VID_HEAP_CONTROL",
    0x4D: "RM_ACCESS_REGISTRY", ESC_RM_MAP_MEMORY: "RM_MAP_MEMORY",
    ESC_RM_UNMAP_MEMORY: "RM_UNMAP_MEMORY",
    0x52: "RM_GET_EVENT_DATA", 0x54: "RM_ALLOC_CONTEXT_DMA2",
    0x56: "RM_ADD_VBLANK_CALLBACK", ESC_RM_MAP_MEMORY_DMA: "RM_MAP_MEMORY_DMA",
    ESC_RM_UNMAP_MEMORY_DMA: "RM_UNMAP_MEMORY_DMA",
    0x59: "RM_BIND_CONTEXT_DMA", 0x5C: "RM_EXPORT_OBJECT_TO_FD",
    0x5D: "RM_IMPORT_OBJECT_FROM_FD", 0x5E: "RM_UPDATE_DEVICE_MAPPING_INFO",
    0x5F: "RM_LOCKLESS_DIAGNOSTIC",
    200: "CARD_INFO", ESC_REGISTER_FD: "REGISTER_FD", 206: "ALLOC_OS_EVENT",
    207: "FREE_OS_EVENT", 209: "STATUS_CODE", ESC_CHECK_VERSION_STR: "CHECK_VERSION_STR",
    ESC_IOCTL_XFER_CMD: "IOCTL_XFER_CMD", 212: "ATTACH_GPUS_TO_FD", 213: "QUERY_DEVICE_INTR",
    214: "SYS_PARAMS", 215: "NUMA_INFO", 216: "SET_NUMA_STATUS", 217: "EXPORT_TO_DMABUF_FD",
    ESC_WAIT_OPEN_COMPLETE: "WAIT_OPEN_COMPLETE",
}  # fmt: skip
"""Every RM and OS escape by number, as the decoder names them."""


def iowr(nr: int, size: int) -> int:
    """_IOWR('F', nr, size): the command word of an RM escape."""
    return (3 << 30) | (size << 16) | (NV_IOCTL_MAGIC << 8) | nr


# --- RM classes (`hClass`; §2.4) ---------------------------------------------------
NV01_ROOT_CLIENT = 0x41
NV01_DEVICE_0 = 0x80
NV20_SUBDEVICE_0 = 0x2080
FERMI_VASPACE_A = 0x90F1
NV01_MEMORY_SYSTEM = 0x3E
NV01_MEMORY_LOCAL_USER = 0x40
NV01_MEMORY_VIRTUAL = 0x70
NV01_MEMORY_SYSTEM_OS_DESCRIPTOR = 0x71
NV01_MEMORY_LOCAL_PHYSICAL = 0xC2
NV_MEMORY_FABRIC = 0xF8
NV_MEMORY_MULTICAST_FABRIC = 0xFD
NV50_MEMORY_VIRTUAL = 0x50A0

MEMORY_CLASSES: dict[int, str] = {
    NV01_MEMORY_SYSTEM: "sysmem", NV01_MEMORY_LOCAL_USER: "vidmem",
    NV01_MEMORY_SYSTEM_OS_DESCRIPTOR: "os-descriptor", NV01_MEMORY_LOCAL_PHYSICAL: "physical",
    NV_MEMORY_FABRIC: "fabric", NV_MEMORY_MULTICAST_FABRIC: "multicast-fabric",
}  # fmt: skip
"""RM classes whose objects are memory, by the word reports use for them."""
VIRTUAL_CLASSES: dict[int, str] = {NV50_MEMORY_VIRTUAL: "virtual",
                                   NV01_MEMORY_VIRTUAL: "virtual-range"}
"""RM classes whose objects reserve address space and hold no memory."""
ALLOCATION_PARAMS_CLASSES = (NV01_MEMORY_SYSTEM, NV01_MEMORY_LOCAL_USER, NV50_MEMORY_VIRTUAL)
"""Classes whose `pAllocParms` is an NV_MEMORY_ALLOCATION_PARAMS (size @64)."""
NVOS32_ALLOC_FLAGS_VIRTUAL = 0x80000

# --- UVM commands tested by value (plain integers on Linux; §1.1) -----------------
UVM_INITIALIZE = 0x30000001
UVM_DEINITIALIZE = 0x30000002

# --- NV_STATUS codes (§1.1) ---------------------------------------------------------
NV_OK = 0
NV_ERR_NO_MEMORY = 0x51
NV_WARN_NOTHING_TO_DO = 0x10006

# --- CUresult codes (the CUDA driver API's return values; cuda.h) -----------------
CUDA_SUCCESS = 0
CUDA_ERROR_OUT_OF_MEMORY = 2
