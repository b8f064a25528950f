"""UVM tools tracker client: struct layouts against docs/driver-facts.md (§1.3-1.4,
§5.2-5.3), the ABI choice by driver version, the ring drain, and the tracker
protocol and DriverPoller against a SYNTHETIC fake of the driver side
(tests/uvm_fake.py). Live runs against the FUSE stand-in are at the end (`live`)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gputrace.record.driver_layer import poller as driver_layer
from gputrace.record.driver_version import parse_version
from gputrace.record.uvm_tools import abi as uvm_tools_abi
from gputrace.record.uvm_tools import gpu_uuids
from gputrace.record.uvm_tools import tracker as uvm_tools
from tests import uvm_fake


def off(s: type[ctypes.Structure], f: str) -> int:
    return int(getattr(s, f).offset)


# ------------------------------------------------------------------ layouts
def test_init_params_layouts_match_facts() -> None:
    p = uvm_tools_abi.InitParams
    assert ctypes.sizeof(p) == 56
    assert [off(p, f) for f in ("queueBuffer", "queueBufferSize", "controlBuffer", "processor",
                                "allProcessors", "uvmFd", "rmStatus")] == [0, 8, 16, 24, 40, 44, 48]
    n = uvm_tools_abi.InitParamsNegotiated  # 550.54.14-555.x
    assert ctypes.sizeof(n) == 64
    assert [off(n, f) for f in ("rmStatus", "requestedVersion", "grantedVersion")] == [48, 52, 56]
    v = uvm_tools_abi.InitParamsVersioned  # 560.x
    assert ctypes.sizeof(v) == 56
    assert (off(v, "version"), off(v, "rmStatus")) == (48, 52)


def test_small_params_layouts_match_facts() -> None:
    assert ctypes.sizeof(uvm_tools_abi.FlagsParams) == 16
    assert off(uvm_tools_abi.FlagsParams, "rmStatus") == 8
    assert ctypes.sizeof(uvm_tools_abi.StatusParams) == 4
    assert ctypes.sizeof(uvm_tools_abi.UuidTableParams) == 16
    assert off(uvm_tools_abi.UuidTableParams, "rmStatus") == 8
    c = uvm_tools_abi.UuidTableParamsCount
    assert (ctypes.sizeof(c), off(c, "count"), off(c, "rmStatus")) == (16, 8, 12)
    n = uvm_tools_abi.UuidTableParamsNegotiated
    assert (ctypes.sizeof(n), off(n, "count"), off(n, "rmStatus"), off(n, "version")) == (
        24, 8, 12, 16)
    v = uvm_tools_abi.UuidTableParamsVersioned
    assert (ctypes.sizeof(v), off(v, "version"), off(v, "rmStatus")) == (16, 8, 12)


def test_control_data_layout_matches_facts() -> None:
    c = uvm_tools_abi.ControlData
    assert ctypes.sizeof(c) == 528
    assert [off(c, f) for f in ("get_ahead", "get_behind", "put_ahead", "put_behind",
                                "dropped")] == [0, 4, 8, 12, 16]


def test_enabled_events_and_counters() -> None:
    assert sorted(uvm_tools_abi.EVENT_TYPES) == [1, 2, 3, 4, 6, 7, 8, 10, 11, 12, 13]
    assert uvm_tools_abi.COUNTER_FLAGS == 0x1 | 0x2 | 0x4 | 0x80 | 0x100 | 0x200


@pytest.mark.parametrize(
    ("version", "name", "queue", "init_cmd", "uuid_cmd", "cpu_id"),
    [
        ("535.288.01", "single", 1, 56, 64, False),
        ("550.40.07", "single", 1, 56, 64, False),
        ("550.40.53", "negotiated", 2, 56, 64, False),  # side branch
        ("550.54.14", "negotiated", 2, 56, 64, False),
        ("555.42.02", "negotiated", 2, 56, 64, False),
        ("560.35.03", "version-field", 2, 56, 64, False),
        ("565.57.01", "separate-ioctls", 2, 76, 77, True),
        ("580.159.04", "separate-ioctls", 2, 76, 77, True),
        ("595.45.04", "separate-ioctls", 2, 76, 77, True),
    ],
)
def test_tools_abi_by_driver_version(version: str, name: str, queue: int, init_cmd: int,
                                     uuid_cmd: int, cpu_id: bool) -> None:
    abi = uvm_tools_abi.tools_abi(parse_version(version))
    assert (abi.name, abi.version, abi.init_cmd, abi.uuid_cmd, abi.cpu_fault_has_cpu_id) == (
        name, queue, init_cmd, uuid_cmd, cpu_id)
    assert abi.entry_size == {1: 64, 2: 72}[queue]


@pytest.mark.parametrize(
    ("version", "queue", "init_cmd", "uuid_cmd", "params"),
    [
        ("580.159.04", 1, 56, 64, uvm_tools_abi.InitParams),  # the old ioctl still gives V1
        ("565.57.01", 2, 76, 77, uvm_tools_abi.InitParams),
        ("560.35.03", 1, 56, 64, uvm_tools_abi.InitParamsVersioned),  # version field = 1
        ("550.54.14", 1, 56, 64, uvm_tools_abi.InitParamsNegotiated),  # requestedVersion = 1
        ("535.288.01", 1, 56, 64, uvm_tools_abi.InitParams),
    ],
)
def test_tools_abi_forced_queue_version(version: str, queue: int, init_cmd: int, uuid_cmd: int,
                                        params: type) -> None:
    abi = uvm_tools_abi.tools_abi(parse_version(version), queue)
    assert (abi.version, abi.init_cmd, abi.uuid_cmd, abi.init_params) == (
        queue, init_cmd, uuid_cmd, params)


def test_tools_abi_refuses_a_queue_version_the_driver_lacks() -> None:
    with pytest.raises(uvm_tools.ToolsError, match="only the V1"):
        uvm_tools_abi.tools_abi(parse_version("535.288.01"), 2)
    with pytest.raises(uvm_tools.ToolsError, match="1 or 2"):
        uvm_tools_abi.tools_abi(parse_version("580.159.04"), 3)


# ------------------------------------------------------------------ the ring
@pytest.fixture
def queue() -> Iterator[uvm_tools.EventQueue]:
    q = uvm_tools.EventQueue(8, 72)
    yield q
    q.close()


def _put(q: uvm_tools.EventQueue, start: int, recs: list[bytes]) -> None:
    for i, r in enumerate(recs):
        ctypes.memmove(q.buffer.addr + ((start + i) % q.entries) * 72, r, 72)
    q.control.put_behind = q.control.put_ahead = (start + len(recs)) % q.entries


def test_drain_copies_exactly_the_new_records(queue: uvm_tools.EventQueue) -> None:
    assert queue.drain() == b""
    recs = [bytes([3, i]) * 36 for i in range(5)]
    _put(queue, 0, recs)
    assert queue.drain() == b"".join(recs)
    assert (queue.control.get_ahead, queue.control.get_behind) == (5, 5)
    assert queue.drain() == b""


def test_drain_wraps_around(queue: uvm_tools.EventQueue) -> None:
    _put(queue, 0, [b"\0" * 72] * 6)
    queue.drain()
    recs = [bytes([2, i]) * 36 for i in range(5)]  # slots 6, 7, 0, 1, 2
    _put(queue, 6, recs)
    assert queue.drain() == b"".join(recs)
    assert queue.control.get_behind == 3


def test_queue_entries_must_be_power_of_two() -> None:
    with pytest.raises(uvm_tools.ToolsError, match="power of two"):
        uvm_tools.EventQueue(1000, 72)


def test_dropped_counters_are_read(queue: uvm_tools.EventQueue) -> None:
    queue.control.dropped[3] = 7
    assert queue.dropped()[3] == 7 and sum(queue.dropped()) == 7


# ------------------------------------------------------------------ mapping
def test_processor_map_goes_through_uuids() -> None:
    other = bytes(16 * [0xEE])
    table = [uvm_fake.CPU_UUID, b"\0" * 16, uvm_fake.GPU_UUID, other] + [b"\0" * 16] * 3
    gpus = {uvm_fake.GPU_UUID: 3}
    assert gpu_uuids.processor_map(table, gpus) == {0: -1, 2: 3}
    assert gpu_uuids.unmapped(table, gpus) == [gpu_uuids.format_uuid(other)]
    assert gpu_uuids.processor_map(None, gpus) == {0: -1}


def test_uuid_text_round_trip() -> None:
    text = gpu_uuids.format_uuid(uvm_fake.GPU_UUID)
    assert text.startswith("GPU-") and len(text) == 40
    assert gpu_uuids.parse_uuid(text) == uvm_fake.GPU_UUID
    assert gpu_uuids.parse_uuid("GPU-nothex") is None


# ------------------------------------------------------------------ protocol (fake)
@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> uvm_fake.FakeToolsDriver:
    drv = uvm_fake.FakeToolsDriver()
    monkeypatch.setattr(uvm_tools, "ioctl", drv.ioctl)
    return drv


@pytest.fixture
def devdir(tmp_path: Path) -> Path:
    for name in ("nvidia-uvm", "nvidia-uvm-tools"):
        (tmp_path / name).write_bytes(b"")
    return tmp_path


@pytest.fixture
def target(devdir: Path) -> Iterator[subprocess.Popen[str]]:
    """A SYNTHETIC target: a child holding <devdir>/nvidia-uvm open until its stdin closes."""
    code = ("import os, sys; fd = os.open(sys.argv[1], os.O_RDWR); print(fd, flush=True); "
            "sys.stdin.read()")
    p = subprocess.Popen([sys.executable, "-c", code, str(devdir / "nvidia-uvm")],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    p.stdout.readline()  # the fd is open
    yield p
    if p.poll() is None:
        p.kill()
    p.wait()


def _fd_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_tracker_protocol_order(fake: uvm_fake.FakeToolsDriver, devdir: Path,
                                target: subprocess.Popen[str]) -> None:
    abi = uvm_tools_abi.tools_abi(parse_version("580.159.04"))
    tr = uvm_tools.Tracker.open(target.pid, str(devdir), abi, 1024)
    try:
        cmds = [c for _, c in fake.calls]
        assert cmds == [76, 58, 76, 60]  # queue tracker, events, counter tracker, counters
        assert tr.info is not None and tr.info.counters
        assert tr.processors() is not None
        assert os.readlink(f"/proc/self/fd/{tr.uvm_fd}") == str(devdir / "nvidia-uvm")
    finally:
        tr.close()
    assert tr.uvm_fd == tr.tools_fd == tr.pidfd == -1


def test_tracker_tries_the_next_uvm_fd(fake: uvm_fake.FakeToolsDriver, devdir: Path,
                                       target: subprocess.Popen[str]) -> None:
    abi = uvm_tools_abi.tools_abi(parse_version("580.159.04"))
    # the first candidate is refused like an fd that never saw UVM_INITIALIZE
    real = uvm_tools.uvm_fds(target.pid, str(devdir))
    orig = fake.ioctl
    seen: list[int] = []

    def refuse_first(fd: int, cmd: int, p: ctypes.Structure) -> None:
        orig(fd, cmd, p)
        if cmd == 76 and not seen:
            seen.append(fd)
            p.rmStatus = uvm_tools_abi.NV_ERR_ILLEGAL_ACTION

    uvm_tools.ioctl = refuse_first  # type: ignore[assignment]
    with pytest.raises(uvm_tools.ToolsError, match="rmStatus 0x1d"):
        uvm_tools.Tracker.open(target.pid, str(devdir), abi, 1024, fds=real)
    seen.clear()
    tr = uvm_tools.Tracker.open(target.pid, str(devdir), abi, 1024, fds=real + real)
    tr.close()


def test_attach_without_uvm_fd_says_why(devdir: Path) -> None:
    layer = driver_layer.DriverPoller(str(devdir), "580.159.04", rm=False)
    assert not layer.attach(os.getpid())
    assert "no" in layer.failures[0]["error"] and "nvidia-uvm fd" in layer.failures[0]["error"]


def test_layer_decodes_drains_and_closes_on_exit(
    fake: uvm_fake.FakeToolsDriver, devdir: Path, target: subprocess.Popen[str]
) -> None:
    layer = driver_layer.DriverPoller(str(devdir), "580.159.04", queue_entries=64, rm=False,
                                     gpu_uuids={uvm_fake.GPU_UUID: 0})
    layer.start()
    try:
        assert layer.attach(target.pid, already_running=True)
        t = layer._targets[target.pid].tracker
        fds = [t.tools_fd, t.counter_fd, t.uvm_fd, t.pidfd]
        # SYNTHETIC stream: batch 7 with 3 faults (one duplicate), its replay, a migration
        recs = [uvm_fake.gpu_fault_v2(7, 0x200000000000, 1000),
                uvm_fake.gpu_fault_v2(7, 0x200000001000, 1010),
                uvm_fake.gpu_fault_v2(7, 0x200000001000, 1020),
                uvm_fake.replay_v2(7, 1100),
                uvm_fake.migration_v2(0, 1, 0x200000000000, 2 << 20, 1200, 1300)]
        assert fake.emit(b"".join(recs)) == 0
        fake.set_counters([64 << 20, 0, 5, 0, 0, 0, 0, 0, 0, 3])
        got: dict[str, int] = {}
        assert target.stdin is not None
        target.stdin.close()
        target.wait()
        while target.pid in layer._targets:
            for name, tabs in layer.poll().items():
                got[name] = got.get(name, 0) + sum(x.num_rows for x in tabs)
        assert got["faults"] == 3 and got["fault_batches"] == 1 and got["migrations"] == 1
        assert got["uvm_counters"] >= 6
        assert not any(_fd_open(fd) and os.path.exists(f"/proc/self/fd/{fd}")
                       and os.readlink(f"/proc/self/fd/{fd}").startswith(str(devdir))
                       for fd in fds)
        m = layer.manifest()
        assert m["driver_layer"]["trackers_attached"] == [target.pid]
        assert m["driver_layer"]["missed_before_attach"][0]["pid"] == target.pid
        assert m["driver_layer"]["closed"][0]["pid"] == target.pid
        assert m["clock"]["uvm_events"].startswith("CLOCK_MONOTONIC_RAW")
        assert m["layers"] == ["uvm_tools"]
    finally:
        layer.stop()


def test_layer_gpu_index_comes_from_the_uuid(
    fake: uvm_fake.FakeToolsDriver, devdir: Path, target: subprocess.Popen[str]
) -> None:
    layer = driver_layer.DriverPoller(str(devdir), "580.159.04", queue_entries=64, rm=False,
                                     gpu_uuids={uvm_fake.GPU_UUID: 5})
    layer.start()
    try:
        assert layer.attach(target.pid)
        fake.emit(uvm_fake.gpu_fault_v2(1, 0x1000, 10) + uvm_fake.replay_v2(1, 20))
        tabs = layer.stop()
    finally:
        layer.stop()
    assert tabs["faults"][0].column("gpu_index").to_pylist() == [5]


def test_tiny_queue_counts_drops(fake: uvm_fake.FakeToolsDriver, devdir: Path,
                                 target: subprocess.Popen[str]) -> None:
    layer = driver_layer.DriverPoller(str(devdir), "580.159.04", queue_entries=4, rm=False)
    assert layer.attach(target.pid)  # not started: nothing drains in the background
    dropped = fake.emit(b"".join(uvm_fake.gpu_fault_v2(1, 0x1000 * i, i) for i in range(10)))
    assert dropped == 7  # a 4-entry ring holds 3
    layer.poll()
    assert layer.manifest()["drops"]["uvm_tools:gpu_fault"] == 7
    layer.stop()


def test_sample_interval_is_validated(devdir: Path) -> None:
    from gputrace.errors import UsageError

    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(UsageError):
            driver_layer.DriverPoller(str(devdir), None, sample_ms=bad, rm=False)


def test_drains_are_joined_into_capped_feeds() -> None:
    from gputrace.record.uvm_tools.target import coalesce as _coalesce

    assert _coalesce([b"a", b"b", b"c"], 100) == [b"abc"]
    assert _coalesce([], 100) == []
    assert _coalesce([b"x"], 100) == [b"x"]
    # feeds are capped (the decoder holds the GIL per call) and cut at the cap
    assert _coalesce([b"aabb", b"ccddee"], 4) == [b"aabb", b"ccdd", b"ee"]
    assert _coalesce([b"aa", b"bbccdd"], 4) == [b"aabb", b"ccdd"]
