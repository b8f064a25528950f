"""The TEST STAND-IN's UVM tools interface and heap model (tests/standin): trackers in the
caller's memory, in-process and through pidfd_getfd, drops, counters, FB_GET_INFO_V2 after a
planned fragmentation, and the uvm file's release only after the last reference.

They need root, /dev/fuse and libfuse3-dev, and skip with the reason otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.standin import standin
from tests.standin import uvm_tools_client as tc

NO_MOUNT = standin.skip_reason()
needs_mount = pytest.mark.skipif(NO_MOUNT is not None, reason=NO_MOUNT or "")
ALL_EVENTS = sum(1 << t for t in (1, 2, 3, 4, 6, 7, 8, 10, 11, 12, 13))
NAMES = {1: "cpu_fault", 2: "migration", 3: "gpu_fault", 4: "gpu_fault_replay",
         10: "thrashing_detected", 11: "throttling_start", 12: "throttling_end", 13: "map_remote"}


def _uvm_workload() -> Path:
    standin.build("uvm_workload")
    return standin.BUILD_DIR / "uvm_workload"


def _events(log: Path) -> list[dict[str, Any]]:
    return [d for d in (json.loads(x) for x in log.read_text().splitlines()) if d["ev"] == "event"]


def _go(w: standin.WaitingWorkload) -> None:
    rc, out, err = w.go()
    assert (rc, out) == (0, "DONE\n"), err


def _drain_all(t: tc.Tracker, proc: subprocess.Popen[str]) -> list[tuple[int, bytes]]:
    """Drains while the workload runs (the queue may be smaller than the stream)."""
    got: list[tuple[int, bytes]] = []
    while proc.poll() is None:
        got += t.drain()
    return got + t.drain()


@needs_mount
@pytest.mark.parametrize("v2", [True, False])
def test_tracker_from_another_process_sees_the_logged_stream(tmp_path: Path, v2: bool) -> None:
    exe = _uvm_workload()
    exp = standin.print_expected(exe)
    log = tmp_path / "events.jsonl"
    with standin.mounted_driver(tmp_path, event_log=log) as dev, \
            standin.started_waiting([str(exe), str(dev), "--wait"]) as w:
        uvm_fd = next(int(fd) for fd in os.listdir(f"/proc/{w.pid}/fd")
                      if os.readlink(f"/proc/{w.pid}/fd/{fd}").endswith("/nvidia-uvm"))
        dup = tc.pidfd_getfd(w.pid, uvm_fd)
        t = tc.Tracker(str(dev), dup, 1 << 16, v2=v2)
        assert t.status == 0
        assert tc.flags_call(t.tools_fd, tc.ENABLE_EVENTS, ALL_EVENTS) == 0
        c = tc.Tracker(str(dev), dup, 0, v2=v2)
        assert c.status == 0
        assert tc.flags_call(c.tools_fd, tc.ENABLE_COUNTERS, (1 << 10) - 1) == 0
        assert w.proc.stdin is not None
        w.proc.stdin.write("go\n")
        w.proc.stdin.flush()
        got = _drain_all(t, w.proc)
        assert w.proc.wait() == 0
        counters = c.counters()
        dropped = t.dropped()
        st = standin.read_state(dev)
        t.close()
        c.close()
        os.close(dup)
    evs = _events(log)
    tid = str(next(tr["id"] for tr in st.trackers if tr["entries"] == 1 << 16))
    key = "v2" if v2 else "v1"
    logged = [(e["delivered"][tid], bytes.fromhex(e[key])) for e in evs if tid in e["delivered"]]
    assert got == logged  # the exact records, in queue order
    assert sum(dropped) == 0
    by_name = Counter(NAMES[rec[0]] for _, rec in got)
    assert dict(by_name) == {k: v for k, v in exp["by_type"].items() if v}
    assert counters[0] == exp["counters"]["bytes_htd"]
    assert counters[1] == exp["counters"]["bytes_dth"]
    assert counters[2] == exp["counters"]["cpu_faults"]
    assert counters[9] == exp["counters"]["gpu_faults"]
    mig: Counter[tuple[str, str]] = Counter()
    for e in evs:
        if e["name"] == "migration":
            cause = {1: "user", 2: "coherence", 3: "prefetch", 4: "eviction"}[e["cause"]]
            mig[(f"{cause} {e['src']}->{e['dst']}", "count")] += 1
            mig[(f"{cause} {e['src']}->{e['dst']}", "bytes")] += e["size"]
    assert {k: {"count": mig[(k, "count")], "bytes": mig[(k, "bytes")]}
            for k in exp["migrations"]} == exp["migrations"]


@needs_mount
def test_in_process_tracker_uuid_table_and_tiny_queue_drops(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    with standin.mounted_driver(tmp_path, event_log=log, gpus=2) as dev:
        uvm = os.open(dev / "nvidia-uvm", os.O_RDWR)
        t = tc.Tracker(str(dev), uvm, 8)  # before UVM_INITIALIZE: not a va space
        assert t.status == 0x16  # NV_ERR_ILLEGAL_ACTION, as the driver
        t.close()
        init = tc.ctypes.create_string_buffer(16)
        tc.uvm_ioctl(uvm, tc.UVM_INITIALIZE, init)
        reg = tc.ctypes.create_string_buffer(b"GPU-stand-in-\0\0\x01" + bytes(24), 40)
        tc.uvm_ioctl(uvm, 37, reg)  # UVM_REGISTER_GPU of GPU 1 only
        tab = tc.ctypes.create_string_buffer(257 * 16)
        p = tc.ctypes.create_string_buffer(tc.struct.pack("<QI4x", tc.ctypes.addressof(tab), 0), 16)
        tc.uvm_ioctl(uvm, tc.GET_PROCESSOR_UUID_TABLE_V2, p)
        assert tc.status_at(p, 8) == 0
        entries = [bytes(tab[i * 16:(i + 1) * 16]) for i in range(257)]
        assert entries[0] == bytes.fromhex("a65e0f4ed7d47ba25047412c142a7773")  # the CPU
        assert entries[9] == b"GPU-stand-in-\0\0\x01"  # GPU 1 is processor 8 * 1 + 1 in V2
        assert all(e == bytes(16) for i, e in enumerate(entries) if i not in (0, 9))
        t = tc.Tracker(str(dev), uvm, 4)  # holds at most 3 records
        assert t.status == 0
        assert tc.flags_call(t.tools_fd, tc.ENABLE_EVENTS, 1 << 1) == 0  # CPU faults only
        base = 0x310000000000
        for op, length in ((1, 16 << 12), (2, 16 << 12)):  # register, then 16 CPU touches
            q = tc.ctypes.create_string_buffer(tc.struct.pack(
                "<IIQQIIIIII", op, 0, base, length, 2, 0, 0, 0, 0, 0xFFFFFFFF), 48)
            tc.uvm_ioctl(uvm, tc.STANDIN_TEST, q)
            assert tc.status_at(q, 44) == 0
        assert t.dropped()[1] == 13
        got = t.drain()
        assert [i for i, _ in got] == [0, 1, 2]
        st = standin.read_state(dev)
        assert [(x["written"], x["dropped"]) for x in st.trackers] == [(3, 13)]
        t.close()
        os.close(uvm)
    evs = _events(log)
    assert len(evs) == 16
    assert sum(1 for e in evs if e["dropped"]) == 13


def _uvm_releases(dev: Path) -> list[dict[str, Any]]:
    return standin.read_state(dev).uvm_releases


@needs_mount
def test_uvm_file_released_only_after_the_trackers_duplicate_is_closed(tmp_path: Path) -> None:
    exe = _uvm_workload()
    with standin.mounted_driver(tmp_path) as dev:
        with standin.started_waiting([str(exe), str(dev), "--wait"]) as w:
            uvm_fd = next(int(fd) for fd in os.listdir(f"/proc/{w.pid}/fd")
                          if os.readlink(f"/proc/{w.pid}/fd/{fd}").endswith("/nvidia-uvm"))
            dup = tc.pidfd_getfd(w.pid, uvm_fd)
            t = tc.Tracker(str(dev), dup, 1 << 16)
            assert t.status == 0
            _go(w)
        # the workload is gone; the tracker (via the driver's reference) and the duplicate
        # still hold its uvm file
        assert standin.wait_state(dev, lambda s: False, timeout=0.2).uvm_releases == []
        t.close()
        closed_tracker = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        st = standin.wait_state(dev, lambda s: not s.trackers)
        assert st.trackers == [] and st.uvm_releases == []
        closing_dup = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        os.close(dup)
        st = standin.wait_state(dev, lambda s: len(s.uvm_releases) == 1)
        assert len(st.uvm_releases) == 1
        assert st.uvm_releases[0]["mono_ns"] > closing_dup > closed_tracker


@needs_mount
def test_fb_get_info_v2_after_planned_fragmentation(tmp_path: Path) -> None:
    exe = _uvm_workload()
    args = ["--frag-blocks", "6", "--frag-mib", "4096", "--budget", str(32 << 30)]
    exp = standin.print_expected(exe, *args)["fragmentation"]
    # 6 x 4 GiB, even ones freed: 3 holes of 4 GiB and an 8 GiB tail
    assert exp == {"heap_size_kib": 32 << 20, "heap_free_kib": 20 << 20,
                   "largest_free_kib": 8 << 20, "largest_free_base_kib": 24 << 20}
    with standin.mounted_driver(tmp_path, budget=32 << 30) as dev:
        r = subprocess.run([str(exe), str(dev), *args], capture_output=True, text=True, timeout=60)
        # the workload compares every FB_GET_INFO_V2 value with the expectation (exit 3 if not)
        assert (r.returncode, r.stdout) == (0, "DONE\n"), r.stderr
        st = standin.read_state(dev)
        assert st.gpus[0]["heap_free"] == 32 << 30
