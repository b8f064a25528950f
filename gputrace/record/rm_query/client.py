"""The recorder as its own RM client: how much GPU memory is free, and how much of
it one allocation could still get, sampled every N ms with the driver's own query.

Sequence (the one nvidia-smi issues on 580; ../shared/real-h200/README.md): open
`nvidiactl`, CHECK_VERSION_STR, a root client (class 0x41), GPU_GET_PROBED_IDS,
GPU_ATTACH_IDS, open each `nvidiaN` with WAIT_OPEN_COMPLETE and REGISTER_FD, a
device (0x80) and a subdevice (0x2080) per GPU. Each sample is one
`NV2080_CTRL_CMD_FB_GET_INFO_V2` per GPU for HEAP_SIZE, HEAP_FREE,
LARGEST_FREE_REGION_SIZE and _BASE. Per process (`process_memory`): GPU_GET_PIDS
names the processes holding a subdevice of the GPU and GPU_GET_PID_INFO their video
memory, as nvidia-smi lists processes. Layouts: docs/driver-facts.md §2.

The ABI (escape numbers, classes, parameter structs) is in `rm_abi`; the thread
that samples every N ms is `memory_sampler.MemorySampler`.

The sampler's ioctls come from the recorder's own process: the syscall probes
must drop them by tgid (`RmClient.pid`, `sampler_tids()`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from gputrace.record.driver_layer.samples import GpuMemorySample, GpuProcessMemorySample
from gputrace.record.driver_version import Version
from gputrace.record.libc import ioctl
from gputrace.record.rm_query.abi import (
    ESC_CHECK_VERSION_STR,
    ESC_REGISTER_FD,
    ESC_RM_ALLOC,
    ESC_RM_CONTROL,
    ESC_RM_FREE,
    ESC_WAIT_OPEN_COMPLETE,
    FB_HEAP_FREE,
    FB_HEAP_SIZE,
    FB_INDICES,
    FB_LARGEST_FREE_BASE,
    FB_LARGEST_FREE_SIZE,
    GET_PID_INFO_MAX_COUNT,
    GET_PIDS_ID_TYPE_CLASS,
    GID_FLAGS_BINARY_SHA1,
    INVALID_ID,
    NV0000_CTRL_CMD_GPU_ATTACH_IDS,
    NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2,
    NV0000_CTRL_CMD_GPU_GET_PROBED_IDS,
    NV01_DEVICE_0,
    NV01_ROOT_CLIENT,
    NV20_SUBDEVICE_0,
    NV2080_CTRL_CMD_FB_GET_INFO_V2,
    NV2080_CTRL_CMD_GPU_GET_GID_INFO,
    NV2080_CTRL_CMD_GPU_GET_PID_INFO,
    NV2080_CTRL_CMD_GPU_GET_PIDS,
    PID_INFO_INDEX_VIDEO_MEMORY_USAGE,
    AttachIds,
    FbInfoV2,
    GetPidInfoParams,
    GetPidsParams,
    GidInfo,
    IdInfoV2,
    Nv0080Alloc,
    Nv2080Alloc,
    Nvos00,
    Nvos21,
    Nvos54,
    Nvos64,
    ProbedIds,
    RegisterFdParams,
    VersionParams,
    WaitOpenParams,
    iowr,
)
from gputrace.record.uvm_tools.gpu_uuids import parse_uuid

_GPU_RE = re.compile(r"^nvidia(\d{1,3})$")


class RmError(Exception):
    """The RM client could not be set up; `str(err)` is the reason."""


def proc_gpu_uuids(root: str = "/") -> dict[bytes, int]:
    """GPU UUID -> device minor from /proc/driver/nvidia/gpus/*/information."""
    out: dict[bytes, int] = {}
    base = Path(root) / "proc/driver/nvidia/gpus"
    with contextlib.suppress(OSError):
        for d in base.iterdir():
            try:
                text = (d / "information").read_text(errors="replace")
            except OSError:
                continue
            uuid = minor = None
            for line in text.splitlines():
                key, _, val = line.partition(":")
                if key.strip() == "GPU UUID":
                    uuid = parse_uuid(val)
                elif key.strip() == "Device Minor" and val.strip().isdigit():
                    minor = int(val.strip())
            if uuid is not None and minor is not None:
                out[uuid] = minor
    return out


@dataclass
class RmGpu:
    """One GPU as our client sees it."""

    gpu_index: int  # the trace's GPU index (device minor)
    device_instance: int
    h_device: int = 0
    h_subdevice: int = 0
    uuid: bytes | None = None
    per_index: bool = False  # the combined FB query failed: ask one index per call


@dataclass
class RmClient:
    """An open RM client with a device and subdevice per GPU."""

    devdir: str
    version: Version
    ctl_fd: int = -1
    h_client: int = 0
    gpu_fds: list[int] = field(default_factory=list)
    gpus: list[RmGpu] = field(default_factory=list)
    driver_reply: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return os.getpid()

    # -- raw calls
    def _alloc(self, parent: int, cls: int, params: ctypes.Structure | None) -> tuple[int, int]:
        """(status, new handle) of one RM_ALLOC."""
        p_addr = ctypes.addressof(params) if params is not None else 0
        size = ctypes.sizeof(params) if params is not None else 0
        root = 0 if cls == NV01_ROOT_CLIENT else self.h_client
        a: Nvos21 | Nvos64
        if self.version >= (535, 43, 2):
            a = Nvos64(hRoot=root, hObjectParent=parent if root else 0, hClass=cls,
                       pAllocParms=p_addr, paramsSize=size)  # fmt: skip
        else:
            a = Nvos21(hRoot=root, hObjectParent=parent if root else 0, hClass=cls,
                       pAllocParms=p_addr)  # fmt: skip
        try:
            ioctl(self.ctl_fd, iowr(ESC_RM_ALLOC, ctypes.sizeof(a)), a)
        except OSError as e:
            return 0xFFFF0000 | (e.errno or 0), 0
        return a.status, a.hObjectNew

    def control(self, obj: int, cmd: int, params: ctypes.Structure) -> int:
        """Status of one RM_CONTROL (0xffff0000|errno when the syscall fails)."""
        c = Nvos54(hClient=self.h_client, hObject=obj, cmd=cmd,
                   params=ctypes.addressof(params), paramsSize=ctypes.sizeof(params))  # fmt: skip
        try:
            ioctl(self.ctl_fd, iowr(ESC_RM_CONTROL, ctypes.sizeof(c)), c)
        except OSError as e:
            return 0xFFFF0000 | (e.errno or 0)
        return int(c.status)

    def _free(self, parent: int, handle: int) -> None:
        f = Nvos00(hRoot=self.h_client, hObjectParent=parent, hObjectOld=handle)
        with contextlib.suppress(OSError):
            ioctl(self.ctl_fd, iowr(ESC_RM_FREE, ctypes.sizeof(f)), f)

    # -- setup and teardown
    @classmethod
    def open(cls, devdir: str, version: Version, proc_root: str = "/") -> RmClient:
        """Open the client and every GPU's device and subdevice; RmError when it cannot."""
        c = cls(devdir, version)
        try:
            c._open(proc_root)
        except BaseException:
            c.close()
            raise
        return c

    def _open(self, proc_root: str) -> None:
        ctl = os.path.join(self.devdir, "nvidiactl")
        try:
            self.ctl_fd = os.open(ctl, os.O_RDWR | os.O_CLOEXEC)
        except OSError as e:
            raise RmError(f"open {ctl}: {e.strerror}") from None
        v = VersionParams(cmd=ord("2"))  # NV_RM_API_VERSION_CMD_QUERY
        try:
            ioctl(self.ctl_fd, iowr(ESC_CHECK_VERSION_STR, ctypes.sizeof(v)), v)
            self.driver_reply = v.versionString.decode(errors="replace") or None
        except OSError:
            self.notes.append("CHECK_VERSION_STR not answered")
        st, self.h_client = self._alloc(0, NV01_ROOT_CLIENT, None)
        if st != 0 or not self.h_client:
            raise RmError(f"root client allocation failed (status {st:#x})")
        minors = sorted(int(m.group(1)) for n in os.listdir(self.devdir)
                        if (m := _GPU_RE.match(n)))  # fmt: skip
        for minor in minors:
            self._open_gpu_file(minor)
        by_uuid = proc_gpu_uuids(proc_root)
        for inst in self._device_instances(minors):
            self._open_gpu(inst, by_uuid)
        if not self.gpus:
            raise RmError("no GPU answered (no device/subdevice could be allocated)")

    def _open_gpu_file(self, minor: int) -> None:
        """Open nvidiaN as a client does: it keeps the GPU initialized while we sample."""
        path = os.path.join(self.devdir, f"nvidia{minor}")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as e:
            self.notes.append(f"open {path}: {e.strerror}")
            return
        self.gpu_fds.append(fd)
        w = WaitOpenParams()
        with contextlib.suppress(OSError):  # from 550.40.07 only
            ioctl(fd, iowr(ESC_WAIT_OPEN_COMPLETE, ctypes.sizeof(w)), w)
        r = RegisterFdParams(ctl_fd=self.ctl_fd)
        try:
            ioctl(fd, iowr(ESC_REGISTER_FD, ctypes.sizeof(r)), r)
        except OSError as e:
            self.notes.append(f"REGISTER_FD on {path}: {e.strerror}")

    def _device_instances(self, minors: list[int]) -> list[int]:
        """Device instances to allocate: RM's probed GPUs, else one per nvidiaN file."""
        probed = ProbedIds()
        ctypes.memset(ctypes.addressof(probed), 0xFF, ctypes.sizeof(probed))
        st = self.control(self.h_client, NV0000_CTRL_CMD_GPU_GET_PROBED_IDS, probed)
        ids = [g for g in probed.gpuIds if g != INVALID_ID] if st == 0 else []
        out = []
        for gid in ids:
            at = AttachIds()
            ctypes.memset(ctypes.addressof(at), 0xFF, ctypes.sizeof(at))
            at.gpuIds[0] = gid
            ast = self.control(self.h_client, NV0000_CTRL_CMD_GPU_ATTACH_IDS, at)
            if ast != 0:
                self.notes.append(f"GPU_ATTACH_IDS {gid:#x}: status {ast:#x}")
            info = IdInfoV2(gpuId=gid, deviceInstance=INVALID_ID)
            ist = self.control(self.h_client, NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2, info)
            if ist == 0 and info.deviceInstance != INVALID_ID:
                out.append(int(info.deviceInstance))
        if not out:
            if ids:
                self.notes.append("GPU_GET_ID_INFO_V2 gave no device instance")
            out = list(range(len(ids))) if ids else minors
        return sorted(set(out))

    def _open_gpu(self, inst: int, by_uuid: dict[bytes, int]) -> None:
        d = Nv0080Alloc(deviceId=inst)
        st, dev = self._alloc(self.h_client, NV01_DEVICE_0, d)
        if st != 0 or not dev:
            self.notes.append(f"device {inst}: status {st:#x}")
            return
        st, sub = self._alloc(dev, NV20_SUBDEVICE_0, Nv2080Alloc(subDeviceId=0))
        if st != 0 or not sub:
            self.notes.append(f"subdevice of device {inst}: status {st:#x}")
            self._free(self.h_client, dev)
            return
        gid = GidInfo(flags=GID_FLAGS_BINARY_SHA1)
        uuid = None
        if self.control(sub, NV2080_CTRL_CMD_GPU_GET_GID_INFO, gid) == 0 and gid.length == 16:
            uuid = bytes(gid.data[:16])
        index = by_uuid.get(uuid, inst) if uuid is not None else inst
        self.gpus.append(RmGpu(index, inst, dev, sub, uuid))

    def close(self) -> None:
        """Free the objects (freeing the client frees its tree) and close the files."""
        if self.ctl_fd >= 0 and self.h_client:
            for g in self.gpus:
                self._free(g.h_device, g.h_subdevice)
                self._free(self.h_client, g.h_device)
            self._free(self.h_client, self.h_client)
            self.h_client = 0
        for fd in self.gpu_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.gpu_fds = []
        if self.ctl_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.ctl_fd)
            self.ctl_fd = -1

    # -- sampling
    def gpu_uuids(self) -> dict[bytes, int]:
        """UUID -> trace GPU index for the GPUs RM named."""
        return {g.uuid: g.gpu_index for g in self.gpus if g.uuid is not None}

    def _fb_info(self, g: RmGpu, indices: tuple[int, ...]) -> tuple[int, dict[int, int]]:
        q = FbInfoV2(fbInfoListSize=len(indices))
        for i, idx in enumerate(indices):
            q.fbInfoList[i].index = idx
        st = self.control(g.h_subdevice, NV2080_CTRL_CMD_FB_GET_INFO_V2, q)
        return st, {q.fbInfoList[i].index: int(q.fbInfoList[i].data) for i in range(len(indices))}

    def sample(self, g: RmGpu) -> GpuMemorySample:
        """One FB_GET_INFO_V2 of `g`, stamped CLOCK_MONOTONIC at the middle of the query."""
        t0 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        vals: dict[int, int] = {}
        status = 0
        if not g.per_index:
            status, vals = self._fb_info(g, FB_INDICES)
            if status != 0:
                g.per_index = True  # one unsupported index must not hide the others
        if g.per_index:
            status, vals = 0, {}
            for idx in FB_INDICES:
                st, one = self._fb_info(g, (idx,))
                if st == 0:
                    vals.update(one)
                else:
                    status = status or st
        t1 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)

        def kib(idx: int) -> int | None:
            v = vals.get(idx)
            return None if v is None else v * 1024

        return GpuMemorySample(
            ts_ns=(t0 + t1) // 2, gpu_index=g.gpu_index, status=status,
            heap_size_bytes=kib(FB_HEAP_SIZE), heap_free_bytes=kib(FB_HEAP_FREE),
            largest_free_bytes=kib(FB_LARGEST_FREE_SIZE),
            largest_free_base_bytes=kib(FB_LARGEST_FREE_BASE),
        )  # fmt: skip

    def process_memory(self, g: RmGpu,
                       trigger: str = "tick") -> tuple[int, list[GpuProcessMemorySample]]:
        """(GET_PIDS status, one row per process RM names on `g`): its video memory from
        GET_PID_INFO. Our own client is left out. RM answers with host pids and counts
        0 bytes for a pid asked from inside another PID namespace: ask from the host's."""
        q = GetPidsParams(idType=GET_PIDS_ID_TYPE_CLASS, id=NV20_SUBDEVICE_0)
        st = self.control(g.h_subdevice, NV2080_CTRL_CMD_GPU_GET_PIDS, q)
        ts = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        if st != 0:
            return st, []
        me = self.pid
        pids = sorted({int(p) for p in q.pidTbl[:min(q.pidTblCount, len(q.pidTbl))]} - {me})
        rows: list[GpuProcessMemorySample] = []
        for lo in range(0, len(pids), GET_PID_INFO_MAX_COUNT):
            chunk = pids[lo:lo + GET_PID_INFO_MAX_COUNT]
            info = GetPidInfoParams(pidInfoListCount=len(chunk))
            for i, pid in enumerate(chunk):
                info.pidInfoList[i].pid = pid
                info.pidInfoList[i].index = PID_INFO_INDEX_VIDEO_MEMORY_USAGE
            ist = self.control(g.h_subdevice, NV2080_CTRL_CMD_GPU_GET_PID_INFO, info)
            ts = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            for i, pid in enumerate(chunk):
                e = info.pidInfoList[i]
                status = ist or int(e.result)
                # RM's own per-process FB usage is private plus shared-owned memory
                # (video_mem.c); duped handles belong to their owner.
                used = int(e.data.memPrivate) + int(e.data.memSharedOwned)
                rows.append(GpuProcessMemorySample(ts, g.gpu_index, pid, status,
                                                   used if status == 0 else None, trigger))
        return 0, rows
