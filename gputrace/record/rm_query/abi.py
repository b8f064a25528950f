"""The RM ioctl ABI the recorder's own RM client speaks: escape numbers, classes,
control commands, FB info indices and the parameter structs (x86-64; sizes pinned
by tests/unit/record/test_rm_client.py). Layouts: docs/driver-facts.md §2.
"""

from __future__ import annotations

import ctypes

# The escape numbers and classes are the driver facts every layer shares (nvabi);
# the control commands, indices and structs below are this client's alone.
from gputrace.nvabi import (  # re-exported: the client's ABI in one namespace
    ESC_CHECK_VERSION_STR as ESC_CHECK_VERSION_STR,
)
from gputrace.nvabi import (
    ESC_REGISTER_FD as ESC_REGISTER_FD,
)
from gputrace.nvabi import (
    ESC_RM_ALLOC as ESC_RM_ALLOC,
)
from gputrace.nvabi import (
    ESC_RM_CONTROL as ESC_RM_CONTROL,
)
from gputrace.nvabi import (
    ESC_RM_FREE as ESC_RM_FREE,
)
from gputrace.nvabi import (
    ESC_WAIT_OPEN_COMPLETE as ESC_WAIT_OPEN_COMPLETE,
)
from gputrace.nvabi import (
    NV01_DEVICE_0 as NV01_DEVICE_0,
)
from gputrace.nvabi import (
    NV01_ROOT_CLIENT as NV01_ROOT_CLIENT,
)
from gputrace.nvabi import (
    NV20_SUBDEVICE_0 as NV20_SUBDEVICE_0,
)
from gputrace.nvabi import (
    NV_IOCTL_BASE as NV_IOCTL_BASE,
)
from gputrace.nvabi import (
    NV_IOCTL_MAGIC as NV_IOCTL_MAGIC,
)
from gputrace.nvabi import (
    iowr as iowr,
)

NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2 = 0x205
NV0000_CTRL_CMD_GPU_GET_PROBED_IDS = 0x214
NV0000_CTRL_CMD_GPU_ATTACH_IDS = 0x215
NV2080_CTRL_CMD_GPU_GET_GID_INFO = 0x2080014A
NV2080_CTRL_CMD_FB_GET_INFO_V2 = 0x20801303
GID_FLAGS_BINARY_SHA1 = 0x2  # FORMAT_BINARY, TYPE_SHA1: the 16 UUID bytes
INVALID_ID = 0xFFFFFFFF
MAX_GPUS = 32

FB_HEAP_SIZE = 0x09
FB_HEAP_FREE = 0x16
FB_LARGEST_FREE_SIZE = 0x12
FB_LARGEST_FREE_BASE = 0x13
FB_INDICES = (FB_HEAP_SIZE, FB_HEAP_FREE, FB_LARGEST_FREE_SIZE, FB_LARGEST_FREE_BASE)
"""NV2080_CTRL_FB_INFO_INDEX_* values (ctrl2080fb.h); every one answers in KiB."""


# --- parameter structs (x86-64; sizes pinned by tests/unit/record/test_rm_client.py) -----------
class VersionParams(ctypes.Structure):
    """nv_ioctl_rm_api_version_t (72 bytes)."""

    _fields_ = [("cmd", ctypes.c_uint32), ("reply", ctypes.c_uint32),
                ("versionString", ctypes.c_char * 64)]  # fmt: skip


class RegisterFdParams(ctypes.Structure):
    _fields_ = [("ctl_fd", ctypes.c_int32)]


class WaitOpenParams(ctypes.Structure):
    _fields_ = [("rc", ctypes.c_int32), ("adapterStatus", ctypes.c_uint32)]


class Nvos00(ctypes.Structure):
    """NVOS00_PARAMETERS, RM_FREE (16 bytes)."""

    _fields_ = [("hRoot", ctypes.c_uint32), ("hObjectParent", ctypes.c_uint32),
                ("hObjectOld", ctypes.c_uint32), ("status", ctypes.c_uint32)]  # fmt: skip


class Nvos21(ctypes.Structure):
    """NVOS21_PARAMETERS before 535.43.02 (32 bytes, status @24)."""

    _fields_ = [("hRoot", ctypes.c_uint32), ("hObjectParent", ctypes.c_uint32),
                ("hObjectNew", ctypes.c_uint32), ("hClass", ctypes.c_uint32),
                ("pAllocParms", ctypes.c_uint64), ("status", ctypes.c_uint32)]  # fmt: skip


class Nvos64(ctypes.Structure):
    """NVOS64_PARAMETERS from 535.43.02 (48 bytes, status @40)."""

    _fields_ = [("hRoot", ctypes.c_uint32), ("hObjectParent", ctypes.c_uint32),
                ("hObjectNew", ctypes.c_uint32), ("hClass", ctypes.c_uint32),
                ("pAllocParms", ctypes.c_uint64), ("pRightsRequested", ctypes.c_uint64),
                ("paramsSize", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("status", ctypes.c_uint32)]  # fmt: skip


class Nvos54(ctypes.Structure):
    """NVOS54_PARAMETERS, RM_CONTROL (32 bytes)."""

    _fields_ = [("hClient", ctypes.c_uint32), ("hObject", ctypes.c_uint32),
                ("cmd", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("params", ctypes.c_uint64), ("paramsSize", ctypes.c_uint32),
                ("status", ctypes.c_uint32)]  # fmt: skip


class ProbedIds(ctypes.Structure):
    _fields_ = [("gpuIds", ctypes.c_uint32 * MAX_GPUS),
                ("excludedGpuIds", ctypes.c_uint32 * MAX_GPUS),
                ("gpuFlags", ctypes.c_uint32 * MAX_GPUS)]  # fmt: skip


class AttachIds(ctypes.Structure):
    _fields_ = [("gpuIds", ctypes.c_uint32 * MAX_GPUS), ("failedId", ctypes.c_uint32)]


class IdInfoV2(ctypes.Structure):
    _fields_ = [("gpuId", ctypes.c_uint32), ("gpuFlags", ctypes.c_uint32),
                ("deviceInstance", ctypes.c_uint32), ("subDeviceInstance", ctypes.c_uint32),
                ("sliStatus", ctypes.c_uint32), ("boardId", ctypes.c_uint32),
                ("gpuInstance", ctypes.c_uint32), ("numaId", ctypes.c_int32)]  # fmt: skip


class Nv0080Alloc(ctypes.Structure):
    """NV0080_ALLOC_PARAMETERS (56 bytes)."""

    _fields_ = [("deviceId", ctypes.c_uint32), ("hClientShare", ctypes.c_uint32),
                ("hTargetClient", ctypes.c_uint32), ("hTargetDevice", ctypes.c_uint32),
                ("flags", ctypes.c_uint32), ("vaSpaceSize", ctypes.c_uint64),
                ("vaStartInternal", ctypes.c_uint64), ("vaLimitInternal", ctypes.c_uint64),
                ("vaMode", ctypes.c_uint32)]  # fmt: skip


class Nv2080Alloc(ctypes.Structure):
    _fields_ = [("subDeviceId", ctypes.c_uint32)]


class GidInfo(ctypes.Structure):
    """NV2080_CTRL_GPU_GET_GID_INFO_PARAMS (268 bytes)."""

    _fields_ = [("index", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("length", ctypes.c_uint32), ("data", ctypes.c_uint8 * 256)]  # fmt: skip


class FbInfo(ctypes.Structure):
    _fields_ = [("index", ctypes.c_uint32), ("data", ctypes.c_uint32)]


class FbInfoV2(ctypes.Structure):
    """NV2080_CTRL_FB_GET_INFO_V2_PARAMS (1028 bytes)."""

    _fields_ = [("fbInfoListSize", ctypes.c_uint32), ("fbInfoList", FbInfo * 128)]


# --- per-process GPU memory, as nvidia-smi lists processes ------------------------------------
# ctrl2080gpu.h at tag 580.142 of github.com/NVIDIA/open-gpu-kernel-modules (the nearest
# tag at or below the H200's 580.159.04); docs/driver-facts.md §2.
NV2080_CTRL_CMD_GPU_GET_PIDS = 0x2080018D
NV2080_CTRL_CMD_GPU_GET_PID_INFO = 0x2080018E
GET_PIDS_ID_TYPE_CLASS = 0x0
GET_PIDS_MAX_COUNT = 950
GET_PID_INFO_MAX_COUNT = 200
PID_INFO_INDEX_VIDEO_MEMORY_USAGE = 0x0


class GetPidsParams(ctypes.Structure):
    """NV2080_CTRL_GPU_GET_PIDS_PARAMS (3812 bytes). With idType CLASS and id
    NV20_SUBDEVICE_0, RM lists every process holding a subdevice of the GPU, with or
    without a GPU context."""

    _fields_ = [("idType", ctypes.c_uint32), ("id", ctypes.c_uint32),
                ("pidTblCount", ctypes.c_uint32),
                ("pidTbl", ctypes.c_uint32 * GET_PIDS_MAX_COUNT)]  # fmt: skip


class VidMemUsage(ctypes.Structure):
    """NV2080_CTRL_GPU_PID_INFO_VIDEO_MEMORY_USAGE_DATA (48 bytes)."""

    _fields_ = [("memPrivate", ctypes.c_uint64), ("memSharedOwned", ctypes.c_uint64),
                ("memSharedDuped", ctypes.c_uint64), ("protectedMemPrivate", ctypes.c_uint64),
                ("protectedMemSharedOwned", ctypes.c_uint64),
                ("protectedMemSharedDuped", ctypes.c_uint64)]  # fmt: skip


class PidInfo(ctypes.Structure):
    """NV2080_CTRL_GPU_PID_INFO (72 bytes: `data` 8-aligned at 16)."""

    _fields_ = [("pid", ctypes.c_uint32), ("index", ctypes.c_uint32),
                ("result", ctypes.c_uint32), ("data", VidMemUsage),
                ("computeInstanceId", ctypes.c_uint32),
                ("gpuInstanceId", ctypes.c_uint32)]  # fmt: skip


class GetPidInfoParams(ctypes.Structure):
    """NV2080_CTRL_GPU_GET_PID_INFO_PARAMS (14408 bytes: the list 8-aligned at 8)."""

    _fields_ = [("pidInfoListCount", ctypes.c_uint32),
                ("pidInfoList", PidInfo * GET_PID_INFO_MAX_COUNT)]  # fmt: skip
