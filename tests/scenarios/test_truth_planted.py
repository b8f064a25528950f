"""Planted truth asserted directly on the JSON report, never through a golden file.

Each scenario in fixtures/scenarios/build.py states its truth in its docstring
(latency quantiles, per-process peaks, GPU imbalance, leak size classes and
per-process sums, fault-rate peaks and means, thrashing at exactly the
threshold, growth slopes, lifetime edges); these tests assert those numbers.
Several are named in docs/testing.md as the test that kills a given mutant.
"""

from __future__ import annotations

from typing import Any

import pytest

from gputrace.trace.builder import T0_NS, GiB, KiB, MiB
from tests.analyze_helpers import SCENARIO_DIR, analyze

US = 1_000
NAMES = ["ioctl_latencies", "memory_by_process", "fault_rates", "lifetime_edges"]


@pytest.fixture(scope="module")
def docs() -> dict[str, dict[str, Any]]:
    return {name: analyze(SCENARIO_DIR / name) for name in NAMES}


def _row(rows: list[dict[str, Any]], **match: Any) -> dict[str, Any]:
    hits = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
    assert len(hits) == 1, (match, rows)
    return hits[0]


# ----------------------------------------------------------------- ioctl latencies
def test_ioctl_latency_quantiles(docs: dict[str, Any]) -> None:
    """101 RM_CONTROL of 1..101 us: nearest-rank p50/p90/p99 51/91/100 us, max 101 us."""
    io = docs["ioctl_latencies"]["summary"]["ioctls"]
    ctl = _row(io, name="RM_CONTROL")
    assert (ctl["device"], ctl["gpu_index"], ctl["count"], ctl["failed"]) == ("ctl", None, 101, 7)
    assert (ctl["latency_ns_p50"], ctl["latency_ns_p90"], ctl["latency_ns_p99"],
            ctl["latency_ns_max"]) == (51 * US, 91 * US, 100 * US, 101 * US)
    assert ctl["total_ns"] == 5151 * US and ctl["mean_ns"] == 51 * US


def test_ioctl_stats_split_by_gpu_including_gpu_0(docs: dict[str, Any]) -> None:
    io = docs["ioctl_latencies"]["summary"]["ioctls"]
    g1 = _row(io, name="RM_ALLOC_MEMORY", gpu_index=1)
    assert (g1["device"], g1["count"], g1["latency_ns_p50"], g1["latency_ns_p90"],
            g1["latency_ns_p99"], g1["latency_ns_max"]) == ("gpu", 5, 30 * US, 50 * US,
                                                            50 * US, 50 * US)
    g0 = _row(io, name="RM_ALLOC_MEMORY", gpu_index=0)
    assert (g0["count"], g0["total_ns"], g0["latency_ns_max"]) == (5, 35 * US, 7 * US)
    uvm = _row(io, name="UVM_MIGRATE")
    assert (uvm["device"], uvm["count"], uvm["failed"], uvm["latency_ns_p99"]) == (
        "uvm", 10, 2, 5 * US)
    assert len(io) == 4


# ------------------------------------------------------------ memory by process
def test_per_process_peaks_and_live_end(docs: dict[str, Any]) -> None:
    procs = docs["memory_by_process"]["summary"]["processes"]
    beta_sum = 4 * KiB + (4 * KiB + 1) + 64 * KiB + MiB + 100 * MiB + 600 * MiB
    want = {
        ("api", 7100): ("alpha", 3, 30 * MiB, 25 * MiB),
        ("api", 7101): ("beta", 6, beta_sum, 0),  # exited: nothing live at the end
        ("api", 7103): ("grower", 33, 33 * MiB, 33 * MiB),
        ("rm", 7102): ("gamma", 3, 60 * MiB, 30 * MiB),
    }
    got = {(p["layer"], p["pid"]): (p["comm"], p["allocations"], p["peak_bytes"],
                                    p["live_end_bytes"]) for p in procs}
    assert got == want


def test_gpu_peaks_ends_and_imbalance(docs: dict[str, Any]) -> None:
    g = docs["memory_by_process"]["summary"]["gpus"]
    assert g["source"] == "rm allocations"
    assert [(x["gpu_index"], x["peak_bytes"], x["end_bytes"], x["full"]) for x in g["gpus"]] == [
        (0, 30 * MiB, 0, False), (1, 10 * MiB, 10 * MiB, False), (2, 20 * MiB, 20 * MiB, False)]
    assert g["imbalance_peak"] == 1.5 and g["imbalance_end"] == 2.0
    assert g["gpus"][0]["peak_share"] == round(30 * MiB / GiB, 6)


def test_leak_size_classes_and_process_sums(docs: dict[str, Any]) -> None:
    lk = docs["memory_by_process"]["leaks"]
    classes = {(r["layer"], r["size_class"]): (r["count"], r["bytes"]) for r in lk["by_size_class"]}
    assert classes == {
        ("api", "<=4KiB"): (1, 4 * KiB),
        ("api", "<=64KiB"): (2, 4 * KiB + 1 + 64 * KiB),
        ("api", "<=2MiB"): (1 + 33, MiB + 33 * MiB),
        ("api", "<=32MiB"): (2, 25 * MiB),
        ("api", "<=512MiB"): (1, 100 * MiB),
        ("api", ">512MiB"): (1, 600 * MiB),
        ("rm", "<=32MiB"): (2, 30 * MiB),
    }
    procs = {(r["layer"], r["pid"], r["kind"]): (r["count"], r["bytes"]) for r in lk["by_process"]}
    assert procs == {
        ("api", 7100, "alive_at_end"): (2, 25 * MiB),
        ("api", 7101, "unfreed_at_exit"): (6, 4 * KiB + 4 * KiB + 1 + 64 * KiB + MiB
                                            + 700 * MiB),
        ("api", 7103, "alive_at_end"): (33, 33 * MiB),
        ("rm", 7102, "alive_at_end"): (2, 30 * MiB),
    }
    assert lk["bytes_by_layer"]["rm"] == 30 * MiB
    assert lk["count_by_layer"] == {"api": 41, "rm": 2, "uvm": 0}


def test_growth_slope_is_exactly_the_planted_rate(docs: dict[str, Any]) -> None:
    """1 MiB every second: 60 MiB per minute, not merely within 5 %."""
    g = _row(docs["memory_by_process"]["leaks"]["growth"], layer="api", pid=7103)
    assert g["slope_bytes_per_min"] == pytest.approx(60 * MiB, rel=1e-9)
    assert g["flagged"] is True and g["r2"] > 0.999 and g["mad_bytes"] == 0
    assert (g["events"], g["duration_s"], g["peak_bytes"]) == (33, 32.0, 33 * MiB)
    assert 7103 in docs["memory_by_process"]["leaks"]["growing_pids"]


# ------------------------------------------------------------------- fault rates
def test_fault_rate_peaks_and_means(docs: dict[str, Any]) -> None:
    rates = docs["fault_rates"]["fault_rate"]["rates"]
    got = {(r["pid"], r["gpu_index"], r["source"], r["access_type"]):
           (r["faults"], r["mean_per_s"], r["peak_per_s"], r["peak_window_start_s"])
           for r in rates}
    assert got == {
        (8000, 0, "gpu_replayable", "read"): (17, 1.7, 7.0, 4.0),  # tie 4 s / 6 s: earliest
        (8000, None, "cpu", "write"): (5, 0.5, 5.0, 9.0),
        (8001, 1, "gpu_replayable", "write"): (20, 2.0, 20.0, 2.0),
    }


def test_thrashing_at_exactly_the_threshold(docs: dict[str, Any]) -> None:
    """3 reversals with --thrash-min 3 is thrashing; 2 is not (>= not >)."""
    th = docs["fault_rates"]["fault_rate"]["thrashing"]
    assert th["min_reversals"] == 3
    assert [(b["block_2m"], b["reversals"], b["migrations"], b["window_start_s"])
            for b in th["blocks"]] == [(0x7D0000000000, 3, 4, 5.0)]


def test_thrashing_threshold_follows_the_option() -> None:
    th = analyze(SCENARIO_DIR / "fault_rates", ["fault-rate"], thrash_min=2)
    blocks = th["fault_rate"]["thrashing"]["blocks"]
    assert sorted((b["block_2m"], b["reversals"]) for b in blocks) == [
        (0x7D0000000000, 3), (0x7D0000000000 + 2 * MiB, 2)]
    th4 = analyze(SCENARIO_DIR / "fault_rates", ["fault-rate"], thrash_min=4)
    assert th4["fault_rate"]["thrashing"]["blocks"] == []


def test_fault_batch_quantiles(docs: dict[str, Any]) -> None:
    (b,) = docs["fault_rates"]["fault_rate"]["batches"]
    assert (b["gpu_index"], b["batches"], b["faults"], b["duplicates"]) == (0, 5, 150, 10)
    assert (b["faults_p50"], b["faults_max"]) == (30, 50)
    assert (b["service_ns_p50"], b["service_ns_max"]) == (300 * US, 500 * US)
    assert b["duplicate_share"] == pytest.approx(10 / 150, abs=1e-6)


# ---------------------------------------------------------------- lifetime edges
def _leaks(doc: dict[str, Any], pid: int) -> list[tuple[str, str, int]]:
    return sorted((a["layer"], a["kind"], a["size_bytes"]) for a in doc["leaks"]["allocations"]
                  if a["pid"] == pid)


def test_free_at_the_exit_nanosecond_is_teardown(docs: dict[str, Any]) -> None:
    """Freed 1 ns before exit: not a leak. Freed at the exit's nanosecond or never:
    unfreed_at_exit. (The exit-time boundary, to the nanosecond.)"""
    doc = docs["lifetime_edges"]
    assert _leaks(doc, 9000) == [("api", "unfreed_at_exit", 3 * MiB),
                                 ("api", "unfreed_at_exit", 4 * MiB)]
    ages = {a["size_bytes"]: a["age_s"] for a in doc["leaks"]["allocations"] if a["pid"] == 9000}
    assert ages == {3 * MiB: pytest.approx(3.9), 4 * MiB: pytest.approx(3.8)}


def test_rm_handles_are_keyed_with_their_client(docs: dict[str, Any]) -> None:
    """Two clients of one process use the same handle; A's free ends only A's object."""
    doc = docs["lifetime_edges"]
    assert _leaks(doc, 9001) == [("rm", "alive_at_end", 16 * MiB)]
    (a,) = [a for a in doc["leaks"]["allocations"] if a["pid"] == 9001]
    assert (a["id"], a["alloc_ts_ns"]) == (0xBEEF, T0_NS + 1_500_000_000)


def test_parent_freed_before_child_existed_does_not_end_it(docs: dict[str, Any]) -> None:
    """A device freed at 2 s ends the memory under it then, but not memory allocated
    under its handle at 3 s (the parent-free guard: only ends at or after allocation)."""
    doc = docs["lifetime_edges"]
    assert _leaks(doc, 9002) == [("rm", "alive_at_end", 32 * MiB)]


def test_vid_heap_control_allocs_and_frees(docs: dict[str, Any]) -> None:
    """VID_HEAP_CONTROL function 2 (with a size) allocates, function 3 frees."""
    doc = docs["lifetime_edges"]
    assert _leaks(doc, 9003) == [("rm", "alive_at_end", 12 * MiB)]
    (a,) = [a for a in doc["leaks"]["allocations"] if a["pid"] == 9003]
    assert (a["id"], a["what"]) == (0xD0000002, "vid heap")
    heap = _row(doc["summary"]["processes"], layer="rm", pid=9003)
    assert (heap["allocations"], heap["peak_bytes"], heap["live_end_bytes"]) == (
        2, 18 * MiB, 12 * MiB)


def test_lifetime_edges_total(docs: dict[str, Any]) -> None:
    lk = docs["lifetime_edges"]["leaks"]
    assert lk["bytes_by_layer"] == {"api": 7 * MiB, "rm": 60 * MiB, "uvm": 0}
