"""RM client and GPU memory sampler: struct layouts against docs/driver-facts.md §2
and the escapes rm_fb_info.c used on a real H200; live runs against the FUSE
stand-in, whose first-fit heap gives the exact FB_GET_INFO_V2 truth (`live`)."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from gputrace.errors import UsageError
from gputrace.record.driver_version import parse_version
from gputrace.record.rm_query import abi
from gputrace.record.rm_query import client as rc
from gputrace.record.rm_query import sampler as memory_sampler
from tests.standin import standin


def off(s: type[ctypes.Structure], f: str) -> int:
    return int(getattr(s, f).offset)


def test_escape_command_words_match_facts() -> None:
    assert abi.iowr(abi.ESC_RM_CONTROL, ctypes.sizeof(abi.Nvos54)) == 0xC020462A
    assert abi.iowr(abi.ESC_RM_ALLOC, ctypes.sizeof(abi.Nvos64)) == 0xC030462B
    assert abi.iowr(abi.ESC_RM_ALLOC, ctypes.sizeof(abi.Nvos21)) == 0xC020462B
    assert abi.iowr(abi.ESC_RM_FREE, ctypes.sizeof(abi.Nvos00)) == 0xC0104629


def test_rm_struct_layouts_match_facts() -> None:
    assert ctypes.sizeof(abi.Nvos00) == 16 and off(abi.Nvos00, "status") == 12
    assert ctypes.sizeof(abi.Nvos21) == 32 and off(abi.Nvos21, "status") == 24  # before 535.43.02
    n64 = abi.Nvos64
    assert ctypes.sizeof(n64) == 48
    assert [off(n64, f) for f in ("pAllocParms", "pRightsRequested", "paramsSize", "flags",
                                  "status")] == [16, 24, 32, 36, 40]
    n54 = abi.Nvos54
    assert ctypes.sizeof(n54) == 32
    assert [off(n54, f) for f in ("cmd", "params", "paramsSize", "status")] == [8, 16, 24, 28]
    assert ctypes.sizeof(abi.VersionParams) == 72


def test_control_param_layouts_match_the_sdk() -> None:
    assert ctypes.sizeof(abi.ProbedIds) == 384
    assert ctypes.sizeof(abi.AttachIds) == 132
    assert ctypes.sizeof(abi.IdInfoV2) == 32 and off(abi.IdInfoV2, "deviceInstance") == 8
    assert ctypes.sizeof(abi.Nv0080Alloc) == 56 and off(abi.Nv0080Alloc, "vaMode") == 48
    assert ctypes.sizeof(abi.GidInfo) == 268 and off(abi.GidInfo, "data") == 12
    assert ctypes.sizeof(abi.FbInfoV2) == 1028
    assert abi.FB_INDICES == (0x09, 0x16, 0x12, 0x13)
    assert abi.NV2080_CTRL_CMD_FB_GET_INFO_V2 == 0x20801303


@pytest.mark.parametrize("bad", [0, -5, float("nan"), float("inf")])
def test_interval_must_be_finite_and_positive(bad: float) -> None:
    with pytest.raises(UsageError, match="finite"):
        memory_sampler.validate_interval_ms(bad)


def test_proc_gpu_uuids_reads_minor_and_uuid(tmp_path: Path) -> None:
    d = tmp_path / "proc/driver/nvidia/gpus/0000:18:00.0"
    d.mkdir(parents=True)
    (d / "information").write_text(
        "Model: \t\t NVIDIA H200\nGPU UUID: \t GPU-00112233-4455-6677-8899-aabbccddeeff\n"
        "Device Minor: \t 3\n")  # SYNTHETIC
    uuid = bytes.fromhex("00112233445566778899aabbccddeeff")
    assert rc.proc_gpu_uuids(str(tmp_path)) == {uuid: 3}


def test_open_without_control_device_says_why(tmp_path: Path) -> None:
    with pytest.raises(rc.RmError, match="nvidiactl"):
        rc.RmClient.open(str(tmp_path), parse_version("580.159.04"))


SKIP = standin.skip_reason()


@pytest.mark.live
@pytest.mark.skipif(SKIP is not None, reason=SKIP or "")
def test_samples_equal_the_standin_heap(tmp_path: Path) -> None:
    budget = 1 << 30
    with standin.mounted_driver(tmp_path, budget=budget, gpus=2) as dev:
        c = rc.RmClient.open(str(dev), parse_version(standin.DRIVER_VERSION), str(tmp_path))
        try:
            assert [g.gpu_index for g in c.gpus] == [0, 1]
            uuids = [g.uuid for g in c.gpus]
            assert None not in uuids and len(set(uuids)) == 2
            rows = [c.sample(g) for g in c.gpus]
        finally:
            c.close()
        st = standin.wait_state(dev, lambda s: s.scalars["clients"] == 0)
    for r in rows:
        assert (r.status, r.heap_size_bytes, r.heap_free_bytes, r.largest_free_bytes,
                r.largest_free_base_bytes) == (0, budget, budget, budget, 0)
    assert st.scalars["clients"] == 0  # everything the client made is freed again


@pytest.mark.live
@pytest.mark.skipif(SKIP is not None, reason=SKIP or "")
def test_process_memory_equals_each_holders_bytes(tmp_path: Path) -> None:
    """GET_PIDS/GET_PID_INFO against the stand-in's bookkeeping: the planted holders of
    tests/standin/oom_scenario.py, exactly; the client's own process is left out."""
    from tests.standin import oom_scenario as sc

    with standin.mounted_driver(tmp_path, budget=sc.BUDGET_MIB * sc.MIB, gpus=1) as dev:
        pre = sc.pre_holder(dev)
        truth, holders = sc.run(dev, pre.pid)
        try:
            c = rc.RmClient.open(str(dev), parse_version(standin.DRIVER_VERSION), str(tmp_path))
            try:
                st, rows = c.process_memory(c.gpus[0], "incident")
                mem = c.sample(c.gpus[0])
            finally:
                c.close()
        finally:
            for h in [*holders, pre]:
                h.close()
    assert st == 0
    assert {r.pid: r.vidmem_bytes for r in rows} == {
        int(k): v["bytes"] for k, v in truth["holders"].items()}
    assert {(r.status, r.trigger, r.gpu_index) for r in rows} == {(0, "incident", 0)}
    f = truth["failures"][0]
    assert (mem.heap_free_bytes, mem.largest_free_bytes) == (
        f["heap_free_bytes"], f["largest_free_bytes"]) == (384 * sc.MIB, 128 * sc.MIB)
