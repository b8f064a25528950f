"""Which decoded rows are "no memory" failures (the incident signal), and the RM
sampler's answer to one: an immediate sample of that GPU, marked `incident`, with
the delay from the failed call's return."""

from __future__ import annotations

import ctypes
import time
from typing import Any

import numpy as np
import pyarrow as pa

from gputrace import schema
from gputrace.record import incidents
from gputrace.record.driver_layer.samples import GpuMemorySample, GpuProcessMemorySample
from gputrace.record.rm_query import abi
from gputrace.record.rm_query.client import RmGpu
from gputrace.record.rm_query.sampler import MemorySampler

GIB = 1 << 30


def _table(name: str, rows: list[dict[str, Any]]) -> pa.Table:
    t = schema.table(name)
    full = [{c.name: r.get(c.name) for c in t.columns} for r in rows]
    return pa.Table.from_pylist(full, schema=t.arrow_schema)


def test_pid_query_layouts_match_the_sdk() -> None:
    # ctrl2080gpu.h at 580.142: 3 NvU32 + 950 pids; PID_INFO is pid, index, result,
    # then the 8-aligned usage union (6 NvU64) and the SMC subscription (2 NvU32)
    assert abi.NV2080_CTRL_CMD_GPU_GET_PIDS == 0x2080018D
    assert abi.NV2080_CTRL_CMD_GPU_GET_PID_INFO == 0x2080018E
    assert ctypes.sizeof(abi.GetPidsParams) == 3812
    assert abi.GetPidsParams.pidTbl.offset == 12
    assert ctypes.sizeof(abi.PidInfo) == 72 and abi.PidInfo.data.offset == 16
    assert abi.PidInfo.computeInstanceId.offset == 64
    assert ctypes.sizeof(abi.GetPidInfoParams) == 14408
    assert abi.GetPidInfoParams.pidInfoList.offset == 8


def test_cuda_out_of_memory_only_from_allocation_calls() -> None:
    t = _table("cuda_calls", [
        {"ts_ns": 100, "pid": 7, "tid": 7, "func": "cuMemAlloc_v2", "result": 2,
         "latency_ns": 30, "size_bytes": 1 << 40},
        {"ts_ns": 200, "pid": 7, "tid": 7, "func": "cuMemAlloc_v2", "result": 0,
         "latency_ns": 5, "size_bytes": 4096},
        {"ts_ns": 300, "pid": 7, "tid": 7, "func": "cuLaunchKernel", "result": 2,
         "latency_ns": 5},
        {"ts_ns": 400, "pid": 8, "tid": 9, "func": "cuMemAllocManaged", "result": 2,
         "latency_ns": 1, "size_bytes": 64},
        {"ts_ns": 500, "pid": 8, "tid": 9, "func": "cuMemAllocHost_v2", "result": 2,
         "latency_ns": 1, "size_bytes": 64},  # host memory: not the GPU's
    ])  # fmt: skip
    assert incidents.is_oom("cuda_calls", t).to_pylist() == [True, False, False, True, False]
    assert incidents.incidents("cuda_calls", t) == [
        incidents.Incident(130, 7, "api", "cuMemAlloc_v2", 2, None, 1 << 40, 100),
        incidents.Incident(401, 8, "api", "cuMemAllocManaged", 2, None, 64, 400)]


def test_rm_and_uvm_no_memory_failures() -> None:
    t = _table("ioctls", [
        {"ts_ns": 10, "pid": 5, "tid": 5, "device_code": schema.DEV_CTL, "cmd": 0,
         "name": "RM_ALLOC", "status": 0x51, "latency_ns": 4, "size_bytes": 96 << 20},
        {"ts_ns": 20, "pid": 5, "tid": 5, "device_code": schema.DEV_CTL, "cmd": 0,
         "name": "RM_CONTROL", "status": 0x51, "latency_ns": 4},
        {"ts_ns": 30, "pid": 5, "tid": 5, "device_code": schema.DEV_GPU, "gpu_index": 1,
         "cmd": 0, "name": "RM_VID_HEAP_CONTROL", "status": 0x51, "latency_ns": 6},
        {"ts_ns": 40, "pid": 6, "tid": 6, "device_code": schema.DEV_UVM, "cmd": 0,
         "name": "UVM_ALLOC_SEMAPHORE_POOL", "status": 0x51, "latency_ns": 2},
        {"ts_ns": 50, "pid": 6, "tid": 6, "device_code": schema.DEV_UVM, "cmd": 0,
         "name": "UVM_FREE", "status": 0, "latency_ns": 2},
        {"ts_ns": 60, "pid": 6, "tid": 6, "device_code": schema.DEV_CTL, "cmd": 0,
         "name": "RM_ALLOC", "status": None, "latency_ns": 2},
    ])  # fmt: skip
    assert [(i.ts_ns, i.layer, i.call, i.gpu_index) for i in incidents.incidents("ioctls", t)] == [
        (14, "rm", "RM_ALLOC", None), (36, "rm", "RM_VID_HEAP_CONTROL", 1),
        (42, "uvm", "UVM_ALLOC_SEMAPHORE_POOL", None)]


def test_batches_without_failures_and_other_tables_say_none() -> None:
    ok = _table("cuda_calls", [{"ts_ns": 1, "pid": 1, "tid": 1, "func": "cuMemAlloc_v2",
                                "result": 0}])
    assert incidents.is_oom("cuda_calls", ok) is None
    assert incidents.is_oom("gpu_memory", ok) is None
    got: list[incidents.Incident] = []
    sig = incidents.IncidentSignal()
    sig.subscribe(got.append)
    sig.observe("cuda_calls", ok)
    bad = _table("cuda_calls", [{"ts_ns": 1, "pid": 1, "tid": 1, "func": "cuMemAlloc",
                                 "result": 2, "latency_ns": 1}])
    sig.observe("cuda_calls", bad)
    assert got == [incidents.Incident(2, 1, "api", "cuMemAlloc", 2, start_ns=1)]
    assert sig.count == 1


class _FakeClient:
    """Two GPUs; sample() answers a known heap and counts queries per GPU."""

    def __init__(self) -> None:
        self.gpus = [RmGpu(0, 0), RmGpu(1, 1)]
        self.asked: list[tuple[str, int]] = []

    def sample(self, g: RmGpu) -> GpuMemorySample:
        self.asked.append(("fb", g.gpu_index))
        return GpuMemorySample(time.clock_gettime_ns(time.CLOCK_MONOTONIC), g.gpu_index, 0,
                               80 * GIB, 3 * GIB, 1 * GIB, 0)

    def process_memory(self, g: RmGpu,
                       trigger: str = "tick") -> tuple[int, list[GpuProcessMemorySample]]:
        self.asked.append(("pids", g.gpu_index))
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        return 0, [GpuProcessMemorySample(now, g.gpu_index, 4242, 0, 77 * GIB, trigger)]


def test_an_incident_samples_its_gpu_at_once_between_ticks() -> None:
    client = _FakeClient()
    # periods far longer than the test: only the first tick and the incident sample
    s = MemorySampler(client, interval_ms=3_600_000, pid_interval_ms=3_600_000)  # type: ignore[arg-type]
    s.start()
    try:
        deadline = time.monotonic() + 10
        while s.pid_samples == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        ticks, tick_procs = s.take(), s.take_processes()
        assert [r.trigger for r in ticks] == ["tick", "tick"] and len(tick_procs) == 2
        failed = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        s.incident(failed, 1)
        rows = s.take()  # the memory sample: taken in this thread, before incident() returned
        procs: list[GpuProcessMemorySample] = []
        while not procs and time.monotonic() < deadline:  # the processes: the thread's
            time.sleep(0.0005)
            procs = s.take_processes()
    finally:
        s.stop()
    assert [(r.gpu_index, r.trigger) for r in rows] == [(1, "incident")]
    assert rows[0].delay_ns is not None and 0 < rows[0].delay_ns == rows[0].ts_ns - failed
    assert rows[0].delay_ns < 1_000_000_000  # at once, not at the hour-long tick
    assert [(p.gpu_index, p.pid, p.vidmem_bytes, p.trigger) for p in procs] == [
        (1, 4242, 77 * GIB, "incident")]
    assert client.asked[-2:] == [("fb", 1), ("pids", 1)]  # free memory first


def test_an_incident_on_an_unknown_gpu_samples_every_gpu_once() -> None:
    client = _FakeClient()
    s = MemorySampler(client)  # type: ignore[arg-type]
    s.incident(1000, None)  # in the caller's thread: no sampler thread runs here
    assert client.asked == [("fb", 0), ("fb", 1)]
    s.incident(900, None)  # returned before those samples: they show what it left
    s.sample_incidents()  # the processes, once per GPU
    rows = s.take()
    assert [(r.gpu_index, r.trigger) for r in rows] == [(0, "incident"), (1, "incident")]
    assert all(r.delay_ns == r.ts_ns - 1000 for r in rows)
    assert s.incident_samples == 2 and len(s.take_processes()) == 2
    assert client.asked[2:] == [("pids", 0), ("pids", 1)]


def test_a_probe_record_and_its_decoded_row_are_one_incident() -> None:
    rec = np.zeros(1, incidents.OOM_DTYPE)[0]
    rec["ts_ns"], rec["pid"], rec["status"], rec["nr"] = 14, 5, 0x51, 0x2B
    rec["device"], rec["gpu_index"] = schema.DEV_CTL, -1
    early = incidents.from_probe(rec)
    assert early == incidents.Incident(14, 5, "rm", "RM_ALLOC", 0x51, None)
    api = rec.copy()
    api["status"], api["nr"] = 2, 1
    assert incidents.from_probe(api, {1: "cuMemAlloc_v2_ptsz"}) == incidents.Incident(
        14, 5, "api", "cuMemAlloc_v2_ptsz", 2)
    got: list[incidents.Incident] = []
    sig = incidents.IncidentSignal()
    sig.subscribe(got.append)
    sig.fire(early, early=True)
    # the same failure decoded a poll later: ts_ns + latency_ns is the probe's return time
    sig.observe("ioctls", _table("ioctls", [
        {"ts_ns": 10, "pid": 5, "tid": 5, "device_code": schema.DEV_CTL, "cmd": 0,
         "name": "RM_ALLOC", "status": 0x51, "latency_ns": 4, "size_bytes": 1 << 40},
        {"ts_ns": 20, "pid": 5, "tid": 5, "device_code": schema.DEV_UVM, "cmd": 0,
         "name": "UVM_MAP_EXTERNAL_ALLOCATION", "status": 0x51, "latency_ns": 4},
    ]))  # fmt: skip
    assert got == [early, incidents.Incident(24, 5, "uvm", "UVM_MAP_EXTERNAL_ALLOCATION",
                                             0x51, None, None, 20)]
    assert (sig.count, sig.early) == (2, 1)
