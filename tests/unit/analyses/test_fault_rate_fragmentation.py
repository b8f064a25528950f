"""fault-rate and fragmentation from the driver layers (uvm_tools, rm_query).

Truth from real H200 captures (fixtures/real-h200-*), plus small synthetic
traces (built with TraceBuilder, labelled synthetic) for what the captures lack:
thrashing and throttling regions, evictions, failed RM samples, rates on traces
of any length.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gputrace.analyses.fault_rate import fault_rate
from gputrace.analyses.fault_rate.fault_windows import windows
from gputrace.analyses.fragmentation import fragmentation
from gputrace.analyses.helpers.inputs import inputs_from_trace
from gputrace.trace.builder import GiB, KiB, MiB, TraceBuilder
from gputrace.trace.reader import open_trace
from tests.conftest import ROOT

UVM = ROOT / "fixtures" / "real-h200-uvm" / "trace"
FRAG = ROOT / "fixtures" / "real-h200-fragmentation" / "trace"


def _fault_rate(path: Path, **kw: Any) -> dict[str, Any]:
    return fault_rate(inputs_from_trace(open_trace(path)), **kw).to_json()


def _frag(path: Path) -> dict[str, Any]:
    return fragmentation(inputs_from_trace(open_trace(path))).to_json()


def test_real_h200_fault_batches() -> None:
    fr = _fault_rate(UVM)
    assert fr["recorded"] is True and fr["not_recorded_layers"] == []
    (b,) = fr["batches"]
    assert (b["gpu_index"], b["batches"], b["faults"], b["faults_min"], b["faults_p50"],
            b["faults_max"]) == (0, 665, 80_035, 56, 101, 256)
    assert 0 < b["service_ns_p50"] <= b["service_ns_p90"] <= b["service_ns_max"]
    assert 0 < b["duplicate_share"] < 1


def test_real_h200_rates_agree_on_a_96_ms_trace() -> None:
    """The issue's bug: mean 1,063,768/s above a peak of 66,504/s on a 62 ms trace."""
    fr = _fault_rate(UVM)
    gpu = [r for r in fr["rates"] if r["source"] == "gpu_replayable"]
    assert sum(r["faults"] for r in gpu) == 80_035
    for r in fr["rates"]:
        assert r["mean_per_s"] <= r["peak_per_s"] * (1 + 1e-9)
    assert fr["windows"]["count"] == 1 and fr["windows"]["span_s"] < 0.2
    (w,) = [x for x in fr["gpu_windows"] if x["gpu_index"] == 0]
    assert w["faults"] == 80_035 and w["per_s"] == pytest.approx(gpu[0]["peak_per_s"])


def test_real_h200_migrations_by_cause_direction_and_size() -> None:
    m = _fault_rate(UVM)["migrations"]
    got = {(r["cause"], r["direction"]): (r["migrations"], round(r["bytes"] / MiB, 1))
           for r in m["by_cause_direction"]}
    assert got == {("prefetch", "cpu->gpu0"): (525, 56.3), ("user", "gpu0->cpu"): (16, 32.0),
                   ("prefetch", "gpu0->cpu"): (48, 15.8),
                   ("coherence", "cpu->gpu0"): (465, 7.7),
                   ("coherence", "gpu0->cpu"): (48, 0.2)}
    assert m["migrations"] == 1_102
    sizes: dict[str, int] = {}
    for r in m["by_cause_direction_size"]:
        sizes[r["size_class"]] = sizes.get(r["size_class"], 0) + r["migrations"]
    assert sum(sizes.values()) == 1_102 and set(sizes) <= {"<=4KiB", "<=64KiB", "<=2MiB",
                                                           ">2MiB"}


def test_real_h200_resident_bytes_and_counters() -> None:
    fr = _fault_rate(UVM)
    (g,) = fr["oversubscription"]["resident_by_gpu"]
    # the kernel writes all 256 MiB: the 64 MiB the CPU wrote first migrate (the counters
    # say 64 MiB host->device), the other 192 MiB are populated on the GPU by its faults
    # with no migration; then the CPU reads 16 MiB back and 32 MiB are prefetched to it
    assert (g["resident_peak_bytes"], g["populated_bytes"], g["resident_end_bytes"]) == (
        256 * MiB, 192 * MiB, (256 - 16 - 32) * MiB)
    assert g["memory_source"] == "manifest"
    counters = {r["counter"]: r["value"] for r in fr["uvm_counters"]}
    assert (counters["bytes_htod"], counters["bytes_dtoh"], counters["cpu_faults"],
            counters["gpu_faults"]) == (64 * MiB, 48 * MiB, 240, 70_813)
    assert fr["cpu_faults"]["total"] == 240 and fr["cpu_faults"]["writes"] == 192


def test_real_h200_fragmentation_735_percent_unusable() -> None:
    fr = _frag(FRAG)
    assert fr["recorded"] is True and fr["not_recorded_layers"] == ["driver"]
    (g,) = fr["rm"]["gpus"]
    shares = [round(s["unusable_share"], 3) for s in g["series"]]
    assert shares == [0.0, 0.0, 0.735, 0.0]
    w = g["worst"]
    assert (w["heap_free_bytes"], w["largest_free_bytes"]) == (84_186_240 * KiB,
                                                               22_319_040 * KiB)
    assert w["t_s"] == 2.0 and w["unusable_share"] == pytest.approx(0.7349, abs=1e-4)
    # 21 whole 1 GiB allocations fit in the largest region; at most the rest is unusable
    assert w["unusable_share_1g"] == pytest.approx(1 - 21 * GiB / (84_186_240 * KiB),
                                                   abs=1e-6)
    assert g["heap_size_bytes"] == 146_591_680 * KiB


# ------------------------------------------------------------- synthetic traces
def test_rates_never_put_the_mean_above_the_peak(tmp_path: Path) -> None:
    """Synthetic: 7 faults in 2.5 s with 1 s windows; the last window is 0.5 s long
    (half a window: a window of its own)."""
    b = TraceBuilder(layers=("uvm_tools",), duration_s=2.5)
    for k in range(7):
        b.gpu_fault(0.1 + 0.35 * k, 0, 0x1000 * k, pid=3)
    fr = _fault_rate(b.build(tmp_path / "t"))
    (r,) = fr["rates"]
    assert fr["windows"] == {"count": 3, "last_window_s": 0.5, "span_s": 2.5}
    assert r["mean_per_s"] == pytest.approx(7 / 2.5)
    # windows [0,1): 3 faults; [1,2): 3; [2,2.5): 1 -> 2/s; peak 3/s, the earliest
    assert r["peak_per_s"] == pytest.approx(3.0) and r["peak_window_start_s"] == 0.0
    assert r["peak_window_len_s"] == 1.0
    assert r["mean_per_s"] <= r["peak_per_s"]


def test_events_at_the_end_land_in_the_window_holding_them(tmp_path: Path) -> None:
    """Synthetic: the real thrash trace's shape: 7.7 s, every fault at 7.1-7.4 s. The
    peak window starts at 7 s (it used to say 6 s, the remainder merged into the
    window before), divides by its own 0.7 s, and agrees with the thrashing table."""
    b = TraceBuilder(layers=("uvm_tools",), duration_s=7.7)
    for k in range(70):
        b.gpu_fault(7.1 + 0.004 * k, 0, 0x1000 * k, pid=3)
    blk = 0x7E0000000000
    for k in range(4):
        b.migration(7.1 + 0.05 * k, -1 if k % 2 == 0 else 0, 0 if k % 2 == 0 else -1, blk,
                    2 * MiB, pid=3)
    fr = _fault_rate(b.build(tmp_path / "t"))
    (r,) = fr["rates"]
    assert fr["windows"]["count"] == 8
    assert r["peak_window_start_s"] == 7.0
    assert r["peak_window_len_s"] == pytest.approx(0.7)
    assert r["peak_per_s"] == pytest.approx(70 / 0.7)
    assert r["mean_per_s"] == pytest.approx(70 / 7.7) and r["mean_per_s"] <= r["peak_per_s"]
    (th,) = fr["thrashing"]["blocks"]
    assert th["window_start_s"] == 7.0


def test_a_sliver_at_the_end_joins_the_window_before(tmp_path: Path) -> None:
    """Synthetic: 7.2 s, 5 faults at 7.15 s: a 0.2 s remainder (under half a window)
    would make 25/s out of 5 faults; it joins [6, 7.2) instead, whose start and length
    the report gives."""
    b = TraceBuilder(layers=("uvm_tools",), duration_s=7.2)
    for k in range(5):
        b.gpu_fault(7.15 + 0.001 * k, 0, 0x1000 * k, pid=3)
    fr = _fault_rate(b.build(tmp_path / "t"))
    (r,) = fr["rates"]
    assert fr["windows"] == {"count": 7, "last_window_s": 1.2, "span_s": 7.2}
    assert (r["peak_window_start_s"], r["peak_window_len_s"]) == (6.0, 1.2)
    assert r["peak_per_s"] == pytest.approx(5 / 1.2)


@pytest.mark.parametrize(("span_ns", "window_s"), [(1, 1.0), (62_000_000, 1.0),
                                                   (2_500_000_000, 1.0), (2_400_000_000, 1.0),
                                                   (3_000_000_000, 1.0), (10**10, 0.001),
                                                   (10**10 + 7, 0.001)])
def test_window_rule_covers_the_span_exactly(span_ns: int, window_s: float) -> None:
    w, k, last = windows(0, span_ns, window_s)
    assert k >= 1 and (k - 1) * w + last == max(span_ns, 1)
    assert k == 1 or w / 2 <= last < 1.5 * w


def test_driver_thrashing_throttling_and_evictions(tmp_path: Path) -> None:
    """Synthetic: the driver reports a 2 MiB region thrashing between CPU and GPU 1 three
    times, throttles GPU 1 on it for 20 ms, and evicts 4 MiB from GPU 1 to the CPU."""
    b = TraceBuilder(layers=("uvm_tools", "rm_query"), duration_s=1.0, gpus=2,
                     gpu_memory_bytes=8 * GiB)
    region = 0x7F0000200000
    for k in range(3):
        b.uvm_event(0.1 + 0.1 * k, 9, "thrashing", region, size=2 * MiB, processors=(-1, 1))
    b.uvm_event(0.5, 9, "throttling_start", region, processor=1)
    b.uvm_event(0.52, 9, "throttling_end", region, processor=1)
    b.uvm_event(0.6, 9, "throttling_start", region + 4096, processor=1)  # never ends
    b.uvm_event(0.7, 9, "map_remote", region, size=2 * MiB, processor=1, residency=-1,
                reason="thrashing")
    b.migration(0.3, -1, 1, region, 6 * MiB, cause=11, pid=9)
    b.migration(0.8, 1, -1, region, 4 * MiB, cause=5, pid=9)
    b.gpu_memory(0.0, 1, heap=4 * GiB, free=4 * GiB, largest=4 * GiB)
    fr = _fault_rate(b.build(tmp_path / "t"))
    ev = fr["driver_events"]
    (region_row,) = ev["thrashing_regions"]
    assert (region_row["events"], region_row["processors"], region_row["size_bytes"]) == (
        3, "-1,1", 2 * MiB)
    th = ev["throttling"]
    assert th["regions"] == 2
    assert [(r["duration_ns"], r["open_at_end"]) for r in th["longest"]] == [
        (400_000_000, True), (20_000_000, False)]
    kinds = {(r["kind"], r["reason"]): r["events"] for r in ev["by_kind"]}
    assert kinds[("map_remote", "thrashing")] == 1 and kinds[("thrashing", None)] == 3
    assert fr["evictions"]["migrations"] == 1 and fr["evictions"]["bytes"] == 4 * MiB
    (res,) = fr["oversubscription"]["resident_by_gpu"]
    # 6 MiB in, 4 MiB evicted; the manifest gives the GPU's size (8 GiB), so the RM
    # heap sampled (4 GiB) does not stand in (gputrace.analyses.helpers.gpus.memory_sizes)
    assert (res["gpu_index"], res["resident_peak_bytes"], res["resident_end_bytes"],
            res["populated_bytes"], res["gpu_memory_bytes"], res["memory_source"]) == (
        1, 6 * MiB, 2 * MiB, 0, 8 * GiB, "manifest")


def test_gpu_memory_from_the_rm_heap_when_the_manifest_has_none(tmp_path: Path) -> None:
    """Synthetic: two GPUs without a size in the manifest; GPU 1 sampled by RM (4 GiB):
    GPU 1's size comes from the heap, GPU 0's is unknown and named."""
    b = TraceBuilder(layers=("uvm_tools", "rm_query"), duration_s=1.0, gpus=2,
                     gpu_memory_bytes=0)
    b.migration(0.3, -1, 1, 0x7F0000200000, 2 * MiB, cause=11, pid=9)
    b.gpu_memory(0.0, 1, heap=4 * GiB, free=4 * GiB, largest=4 * GiB)
    o = _fault_rate(b.build(tmp_path / "t"))["oversubscription"]
    assert (o["gpu_memory_bytes"], o["gpu_memory_source"], o["gpus_of_unknown_memory"]) == (
        4 * GiB, ["gpu_memory heap"], [0])
    (res,) = o["resident_by_gpu"]
    assert (res["gpu_memory_bytes"], res["memory_source"]) == (4 * GiB, "gpu_memory heap")


def test_resident_first_touch_rules(tmp_path: Path) -> None:
    """Synthetic, one process, GPU 0: block A touched first by the GPU (populated, 2 MiB),
    then migrated to the CPU and back; block B touched first by the CPU, then 1 MiB
    migrated to the GPU (not populated); block C faulted by the GPU but its first
    migration is CPU->GPU (on the CPU before the trace: not populated)."""
    b = TraceBuilder(layers=("uvm_tools",), duration_s=1.0)
    a, bb, c = 0x7E0000000000, 0x7E0000200000, 0x7E0000400000
    b.gpu_fault(0.1, 0, a + 0x1000, pid=3)
    b.migration(0.2, 0, -1, a, 2 * MiB, pid=3)
    b.migration(0.3, -1, 0, a, 2 * MiB, pid=3)
    b.cpu_fault(0.1, 3, bb, write=True)
    b.gpu_fault(0.4, 0, bb + 0x1000, pid=3)
    b.migration(0.41, -1, 0, bb, 1 * MiB, pid=3)
    b.gpu_fault(0.5, 0, c, pid=3)
    b.migration(0.51, -1, 0, c, 64 * KiB, pid=3)
    (res,) = _fault_rate(b.build(tmp_path / "t"))["oversubscription"]["resident_by_gpu"]
    assert res["populated_bytes"] == 2 * MiB
    assert res["resident_end_bytes"] == 2 * MiB + 1 * MiB + 64 * KiB
    assert res["resident_peak_bytes"] == res["resident_end_bytes"]


def test_fragmentation_warns_on_failed_rm_samples(tmp_path: Path) -> None:
    """Synthetic: GPU 0 sampled twice, once failing (NV_ERR_INVALID_STATE 0x40)."""
    b = TraceBuilder(layers=("rm_query",), duration_s=1.0)
    b.gpu_memory(0.0, 0, heap=8 * GiB, free=4 * GiB, largest=1 * GiB)
    b.gpu_memory(0.5, 0, heap=0, free=0, largest=0, status=0x40)
    fr = _frag(b.build(tmp_path / "t"))
    (g,) = fr["rm"]["gpus"]
    assert g["samples"] == 1 and fr["rm"]["failed_samples"] == 1
    assert g["worst"]["unusable_share"] == 0.75
    assert g["worst"]["unusable_share_2m"] == 0.75 and g["worst"]["unusable_share_1g"] == 0.75
    assert any("failed (status 0x40)" in w for w in fr["warnings"])
    assert fr["gpus"] is None  # PMM chunks: not recorded, not "none"


def test_largest_region_below_the_size_makes_all_free_memory_unusable(tmp_path: Path) -> None:
    """Synthetic: 3 GiB free, largest piece 512 MiB: no 1 GiB allocation can succeed."""
    b = TraceBuilder(layers=("rm_query",), duration_s=1.0)
    b.gpu_memory(0.0, 0, heap=8 * GiB, free=3 * GiB, largest=512 * MiB)
    (g,) = _frag(b.build(tmp_path / "t"))["rm"]["gpus"]
    assert g["worst"]["unusable_share_1g"] == 1.0
    assert g["worst"]["unusable_share_64m"] == pytest.approx(1 - 512 / 3072)


def test_no_driver_layers_means_not_recorded(tmp_path: Path) -> None:
    b = TraceBuilder(layers=("syscall",), duration_s=1.0)
    b.process(1, "x")
    t = b.build(tmp_path / "t")
    assert _frag(t)["recorded"] is False
    assert _frag(t)["not_recorded_layers"] == ["driver", "rm_query"]
