"""Real `gputrace record` captures with the driver layer on (one NVIDIA H200, driver
580.159.04, kernel 6.18.44, commit 50ed17d): UVM tools trackers attached from outside
the process and RM GPU memory samples, checked against truths the code under test
never wrote: each workload's own log (truth.json: CLOCK_MONOTONIC step times, torch's
mem_get_info, the thrash probe's second, in-process tracker and its counters), the
driver's counter tracker, and the workloads' sizes. fixtures/README.md tells the story.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from gputrace.cli import main
from gputrace.trace.reader import open_trace
from tests.analyze_helpers import analyze
from tests.conftest import FIXTURES

CUDA = FIXTURES / "real-h200-driver-cuda"
FRAG = FIXTURES / "real-h200-driver-frag"
THRASH = FIXTURES / "real-h200-driver-thrash"
MIB = 1 << 20
GIB = 1 << 30
KIB = 1 << 10
H200_HEAP = 150_109_880_320  # RM heap size of this H200
THRASH_ROUNDS = 40  # uvm_tools_probe.cu: workload_thrash()
THRASH_BYTES = 16 * MIB
# ../shared/real-h200/README.md: the same fragmentation read by a separate C RM client
README_HEAP_FREE_KIB = 84_186_240
README_LARGEST_KIB = 22_319_040


def _json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _cli_json(capsys: pytest.CaptureFixture[str], trace: Path, only: str) -> dict[str, Any]:
    """What `gputrace analyze TRACE --only ONLY --format json` prints."""
    capsys.readouterr()
    assert main(["analyze", str(trace / "trace"), "--only", only, "--format", "json"]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def _table(fixture: Path, name: str) -> pl.DataFrame:
    return open_trace(fixture / "trace").scan(name).collect()


def _counters(fixture: Path) -> dict[str, int]:
    """The counter tracker's final values (cumulative since it attached)."""
    c = _table(fixture, "uvm_counters").sort("ts_ns")
    return {r["counter"]: r["value"] for r in
            c.group_by("counter").agg(pl.col("value").last()).iter_rows(named=True)}


def _ts_range(df: pl.DataFrame) -> tuple[int, int]:
    lo, hi = df.select(pl.col("ts_ns").min().alias("lo"), pl.col("ts_ns").max().alias("hi")).row(0)
    return int(lo), int(hi)


def _bytes_by_direction(fixture: Path) -> dict[tuple[int, int], int]:
    m = _table(fixture, "migrations")
    return {(r["src"], r["dst"]): r["size_bytes"]
            for r in m.group_by("src", "dst").agg(pl.col("size_bytes").sum()).iter_rows(named=True)}


@pytest.fixture(scope="module")
def cuda_truth() -> dict[str, Any]:
    return _json(CUDA / "truth.json")


@pytest.fixture(scope="module")
def frag_truth() -> dict[str, Any]:
    return _json(FRAG / "truth.json")


@pytest.fixture(scope="module")
def probe() -> dict[str, Any]:
    """uvm_tools_probe's own output: its second tracker's tallies and counters."""
    return _json(THRASH / "truth.json")


# ---------------------------------------------------------------- all three


@pytest.mark.parametrize("fixture", [CUDA, FRAG, THRASH], ids=lambda p: p.name)
def test_recorded_on_real_hardware_with_the_driver_layer(fixture: Path) -> None:
    prov = _json(fixture / "PROVENANCE.json")
    assert prov["recorded"] is True and prov["synthetic"] is False
    assert prov["nature"] == "real hardware, real driver"
    assert prov["gputrace_commit"] == "50ed17d" and "580.159.04" in prov["driver"]
    t = open_trace(fixture / "trace")
    assert t.status == "complete" and not t.manifest.get("synthetic")
    assert {"uvm_tools", "rm_query", "api", "syscall"} <= set(t.layers)
    assert sum(t.drops.values()) == 0
    dl = t.manifest["driver_layer"]
    assert dl["trackers_attached"] == [prov["pid"]] and dl["attach_failures"] == []
    assert dl["missed_before_attach"] == [] and dl["unmapped_processors"] == []
    assert dl["tools_abi"]["entry_bytes"] == 72  # UvmEventEntry_V2 on 580
    # The H200 is tools processor 1 (0 is the CPU) but trace GPU 0.
    assert [g["index"] for g in t.manifest["gpus"]] == [0]
    mem = _table(fixture, "gpu_memory")
    assert mem["gpu_index"].unique().to_list() == [0]
    assert mem["status"].unique().to_list() == [0]
    assert mem["heap_size_bytes"].unique().to_list() == [H200_HEAP]


# ---------------------------------------------------------------- gpu_workload


def test_cuda_api_leaks_still_the_six(capsys: pytest.CaptureFixture[str],
                                      cuda_truth: dict[str, Any]) -> None:
    leaks = _cli_json(capsys, CUDA, "leaks")["leaks"]
    assert leaks["total_count"] == 6
    assert leaks["total_bytes"] == cuda_truth["expected_leak_bytes"] == 72_351_744
    kept = cuda_truth["malloc_1m"]["leaked"] + cuda_truth["drv_64m"]["leaked"]
    api = [a for a in leaks["allocations"] if a["layer"] == "api"]
    assert {a["id"] for a in api} == {int(p, 16) for p in kept}


def test_cuda_processor_mapping_gives_gpu_0() -> None:
    f = _table(CUDA, "faults")
    gpu = f.filter(pl.col("source") != "cpu")
    assert gpu["gpu_index"].unique().to_list() == [0]
    assert f.filter(pl.col("source") == "cpu")["gpu_index"].null_count() == 240
    assert _table(CUDA, "fault_batches")["gpu_index"].unique().to_list() == [0]
    m = _table(CUDA, "migrations")
    assert set(m.select("src", "dst").unique().rows()) == {(-1, 0), (0, -1)}


def test_cuda_fault_rows_batches_and_migrations(cuda_truth: dict[str, Any]) -> None:
    f = _table(CUDA, "faults")
    gpu = f.filter(pl.col("source") == "gpu_replayable")
    b = _table(CUDA, "fault_batches")
    assert (gpu.height, b.height, _table(CUDA, "migrations").height) == (31_980, 264, 1_510)
    assert b["faults"].sum() == gpu.height  # every fault row is in its batch
    assert b["duration_ns"].null_count() == 0  # every replay was seen
    assert set(gpu["batch_id"].unique()) == set(b["batch_id"])
    # Every fault and migration lies in the managed buffer the workload allocated.
    lo = int(cuda_truth["managed"]["ptr"], 16)
    hi = lo + cuda_truth["managed"]["size"]
    for t in (f, _table(CUDA, "migrations")):
        assert t.filter((pl.col("address") < lo) | (pl.col("address") >= hi)).height == 0


def test_cuda_migrated_bytes_equal_counters_and_the_workload(cuda_truth: dict[str, Any]) -> None:
    """The counter tracker's byte counters equal the migration events summed by
    direction, exactly; and they are the workload's own sizes: the 64 MiB the CPU wrote
    went to the GPU for the kernel, the 16 MiB the CPU read came back."""
    c = _counters(CUDA)
    by = _bytes_by_direction(CUDA)
    assert by == {(-1, 0): c["bytes_htod"], (0, -1): c["bytes_dtoh"]}
    assert c["bytes_htod"] == cuda_truth["managed"]["cpu_write_bytes"] == 64 * MIB
    assert c["bytes_dtoh"] == cuda_truth["managed"]["cpu_read_bytes"] == 16 * MIB
    assert c["prefetch_bytes_htod"] == c["prefetch_bytes_dtoh"] == 0


def test_cuda_cpu_faults_equal_counter_and_fall_in_their_steps(cuda_truth: dict[str, Any]) -> None:
    cpu = _table(CUDA, "faults").filter(pl.col("source") == "cpu")
    assert cpu.height == _counters(CUDA)["cpu_faults"] == 240
    mg = cuda_truth["managed"]
    w0, w1 = mg["t_cpu_write"]
    r0, r1 = mg["t_cpu_read"]
    writes = cpu.filter(pl.col("access_type") == "write")
    reads = cpu.filter(pl.col("access_type") == "read")
    assert (writes.height, reads.height) == (192, 48)
    assert writes["ts_ns"].is_between(w0, w1).all()
    assert reads["ts_ns"].is_between(r0, r1).all()


def test_cuda_gpu_fault_counter_counts_serviced_entries_not_instances() -> None:
    """The driver bumps the GPU fault counter once per serviced fault entry and writes
    one event for the entry plus one per merged duplicate instance, all with the same
    CPU timestamp: distinct timestamps equal the counter exactly; rows exceed it."""
    gpu = _table(CUDA, "faults").filter(pl.col("source") == "gpu_replayable")
    counter = _counters(CUDA)["gpu_faults"]
    assert gpu["ts_ns"].n_unique() == counter == 25_664
    assert gpu.height - counter == 6_316
    # Each same-timestamp group is one address (entry + its merged instances).
    assert gpu.group_by("ts_ns").agg(pl.col("address").n_unique())["address"].max() == 1


def test_cuda_clock_conversion_puts_driver_events_in_their_steps(
        cuda_truth: dict[str, Any]) -> None:
    """Tools events carry CLOCK_MONOTONIC_RAW; converted, every GPU fault and
    host->device migration falls inside the kernel's step of the workload's own
    CLOCK_MONOTONIC log and every device->host one inside the CPU read step.
    Unconverted (the ~95 ms offset of this host left in) none would."""
    mg = cuda_truth["managed"]
    k0, k1 = mg["t_kernel"]
    r0, r1 = mg["t_cpu_read"]
    gpu = _table(CUDA, "faults").filter(pl.col("source") == "gpu_replayable")
    b = _table(CUDA, "fault_batches")
    m = _table(CUDA, "migrations")
    htod = m.filter(pl.col("dst") == 0)
    dtoh = m.filter(pl.col("src") == 0)
    for ts in (gpu["ts_ns"], b["ts_ns"], htod["ts_ns"]):
        assert ts.is_between(k0, k1).all()
    assert dtoh["ts_ns"].is_between(r0, r1).all()
    off = open_trace(CUDA / "trace").manifest["driver_layer"]["clock_offsets_ns"]
    assert 95_000_000 < off["min"] <= off["max"] < 96_000_000
    assert off["max"] - off["min"] < 10_000
    assert not (gpu["ts_ns"] - off["min"]).is_between(k0, k1).any()


def test_cuda_fault_rate_report_matches_the_tables() -> None:
    fr = analyze(CUDA / "trace", ["fault-rate"])["fault_rate"]
    (bt,) = fr["batches"]
    assert (bt["gpu_index"], bt["batches"], bt["faults"]) == (0, 264, 31_980)
    by: Counter[tuple[int, int]] = Counter()
    for r in fr["migrations"]["by_cause_direction"]:
        by[(r["src"], r["dst"])] += r["bytes"]
    assert by == {(-1, 0): 64 * MIB, (0, -1): 16 * MIB}
    assert fr["driver_events"]["thrashing_regions"] == []
    assert fr["evictions"]["migrations"] == 0


# ---------------------------------------------------------------- fragmentation


def _phase(truth: dict[str, Any], step: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [p for p in truth["phases"] if p["step"] == step]
    (p,) = found
    return p


def test_frag_worst_sample_is_in_the_every_other_block_phase(
        capsys: pytest.CaptureFixture[str], frag_truth: dict[str, Any]) -> None:
    doc = _cli_json(capsys, FRAG, "fragmentation")
    (g,) = doc["fragmentation"]["rm"]["gpus"]
    w = g["worst"]
    assert w["unusable_share"] == pytest.approx(0.735, abs=0.001)
    assert w["heap_free_bytes"] / GIB == pytest.approx(80.3, abs=0.05)
    assert w["largest_free_bytes"] / GIB == pytest.approx(21.3, abs=0.05)
    ts = doc["trace"]["start_ts_ns"] + round(w["t_s"] * 1e9)
    p = _phase(frag_truth, "every other 1 GiB block freed")
    assert p["start_ns"] <= ts <= p["end_ns"]
    # RM's free heap is exactly what torch's mem_get_info said, and exactly the
    # separate C client's HEAP_FREE of an earlier run; the largest free region of
    # that run was 2 MiB larger.
    assert w["heap_free_bytes"] == p["mem_get_info_free"] == README_HEAP_FREE_KIB * KIB
    assert README_LARGEST_KIB * KIB - w["largest_free_bytes"] == 2 * MIB


def test_frag_each_phase_holds_its_state(frag_truth: dict[str, Any]) -> None:
    mem = _table(FRAG, "gpu_memory").with_columns(
        (1 - pl.col("largest_free_bytes") / pl.col("heap_free_bytes")).alias("unusable"))
    for p in frag_truth["phases"]:
        s = mem.filter(pl.col("ts_ns").is_between(p["start_ns"], p["end_ns"]))
        assert 14 <= s.height <= 16, p["step"]  # 1.5 s at 100 ms
        # Every sample of a phase reads torch's own free figure.
        assert s["heap_free_bytes"].unique().to_list() == [p["mem_get_info_free"]], p["step"]
        if p["step"] == "every other 1 GiB block freed":
            assert s["unusable"].min() == pytest.approx(0.735, abs=0.001)
        else:
            assert s.select(pl.col("unusable").max()).item() < 0.001, p["step"]


def test_frag_sample_count_follows_the_interval() -> None:
    t = open_trace(FRAG / "trace")
    mem = _table(FRAG, "gpu_memory")
    first, last = _ts_range(mem)
    span_s = (last - first) / 1e9
    assert t.manifest["driver_layer"]["sample_interval_ms"] == 100.0
    assert mem.height == t.manifest["driver_layer"]["rm_client"]["samples"] == 133
    assert abs(mem.height - (span_s / 0.1 + 1)) <= 2
    # Sampling starts when the target starts, not at the trace's start (the BPF
    # programs compile first): the span is shorter than the trace.
    (proc_start,) = _table(FRAG, "processes")["start_ts_ns"].to_list()
    assert 0 <= first - proc_start < 200_000_000


def test_frag_has_no_managed_memory_activity() -> None:
    for name in ("faults", "fault_batches", "migrations", "uvm_events"):
        assert _table(FRAG, name).height == 0, name
    assert set(_counters(FRAG).values()) == {0}


# ---------------------------------------------------------------- thrash


def test_thrash_rows_equal_the_probes_own_tracker(probe: dict[str, Any]) -> None:
    """Two trackers on one process, gputrace's from outside and the probe's inside:
    the same number of records of each type, neither dropping any."""
    assert probe["mode"] == "thrash" and probe["workload_rc"] == 0
    assert probe["dropped"] == 0
    by = {int(k): v for k, v in probe["by_type"].items()}
    f = _table(THRASH, "faults")
    assert f.filter(pl.col("source") == "gpu_replayable").height == by[3] == 230_148
    assert f.filter(pl.col("source") == "cpu").height == by[1] == 1_920
    assert _table(THRASH, "migrations").height == by[2] == 10_268
    assert _table(THRASH, "fault_batches").height == by[4] == 1_917
    # No thrashing (10), throttling (11, 12), remote map (13), read duplication (7, 8)
    # or fatal fault (6) in either stream.
    assert set(by) == {1, 2, 3, 4}
    assert _table(THRASH, "uvm_events").height == 0


def test_thrash_counters_equal_the_probes_and_the_migrations(probe: dict[str, Any]) -> None:
    """Round 1's kernel populates the buffer on the GPU without a migration; then the
    CPU pulls 16 MiB back each round (40x) and the GPU 16 MiB over each later round
    (39x)."""
    c = _counters(THRASH)
    pc = probe["counters"]  # UvmCounterName order
    assert (c["bytes_htod"], c["bytes_dtoh"], c["cpu_faults"], c["gpu_faults"]) == (
        pc[0], pc[1], pc[2], pc[9])
    assert c["bytes_htod"] == (THRASH_ROUNDS - 1) * THRASH_BYTES
    assert c["bytes_dtoh"] == THRASH_ROUNDS * THRASH_BYTES
    assert _bytes_by_direction(THRASH) == {(-1, 0): c["bytes_htod"], (0, -1): c["bytes_dtoh"]}
    assert _table(THRASH, "faults").filter(pl.col("source") == "cpu").height == c["cpu_faults"]


def test_thrash_gpu_fault_counter_vs_timestamp_groups() -> None:
    """As on gpu_workload, the counter counts fault entries (same-timestamp groups).
    Here 4 more groups than the counter: a few entry+instance groups were split across
    decoder feeds converted with clock offsets a few ns apart (one such pair even runs
    backwards by 11 ns). Tighten to == when conversion is per raw timestamp."""
    gpu = _table(THRASH, "faults").filter(pl.col("source") == "gpu_replayable")
    counter = _counters(THRASH)["gpu_faults"]
    assert counter == 178_933
    assert 0 <= gpu["ts_ns"].n_unique() - counter <= 4


def test_thrash_clock_agrees_with_the_probe(probe: dict[str, Any]) -> None:
    """The probe kept its first and last GPU fault's raw CPU timestamp and read both
    clocks around the workload; converted with its own offset they are our first and
    last GPU fault within 2 us, and every driver event lies in its CLOCK_MONOTONIC
    window."""
    ck = probe["clocks"]
    off = ck["mono"][0] - ck["raw"][0]
    first, last = (r + off for r in ck["gpu_fault_cpu_ts"])
    lo, hi = _ts_range(_table(THRASH, "faults").filter(pl.col("source") == "gpu_replayable"))
    assert abs(lo - first) < 2_000
    assert abs(hi - last) < 2_000
    m0, m1 = ck["mono"]
    for name in ("faults", "fault_batches", "migrations"):
        assert _table(THRASH, name)["ts_ns"].is_between(m0, m1).all(), name


def test_thrash_fault_rate_report(probe: dict[str, Any]) -> None:
    fr = analyze(THRASH / "trace", ["fault-rate"])["fault_rate"]
    (bt,) = fr["batches"]
    assert (bt["gpu_index"], bt["batches"], bt["faults"]) == (0, 1_917, 230_148)
    # The driver reported no thrashing, but the report's own reversal count sees the
    # ping-pong: all 8 blocks of the 16 MiB buffer, migrating CPU->GPU and back in
    # every round after the first: 2 x 40 - 2 reversals each.
    assert fr["driver_events"]["thrashing_regions"] == []
    blocks = fr["thrashing"]["blocks"]
    assert len(blocks) == THRASH_BYTES // (2 * MIB)
    assert {b["reversals"] for b in blocks} == {2 * THRASH_ROUNDS - 2}
    assert {b["processors"] for b in blocks} == {"-1,0"}


# ------------------------------------------------- report rules on the real traces


def test_thrash_peak_window_is_the_window_holding_the_faults() -> None:
    """Every GPU fault of the thrash run lies in [7 s, 8 s) of the trace; the busiest
    window must start there (not at 6 s with the remainder merged in), agree with the
    thrashing table's window, and its rate divide by that window's own length."""
    doc = analyze(THRASH / "trace", ["fault-rate"])
    fr, start = doc["fault_rate"], doc["trace"]["start_ts_ns"]
    gpu = _table(THRASH, "faults").filter(pl.col("source") == "gpu_replayable")
    lo, hi = ((t - start) / 1e9 for t in _ts_range(gpu))
    assert 7.0 <= lo <= hi < 8.0
    (r,) = [x for x in fr["rates"] if x["source"] == "gpu_replayable"]
    assert r["peak_window_start_s"] == 7.0
    assert r["peak_window_start_s"] + r["peak_window_len_s"] > hi
    assert r["peak_window_len_s"] == pytest.approx(fr["windows"]["span_s"] - 7.0, abs=1e-6)
    assert r["peak_per_s"] == pytest.approx(230_148 / r["peak_window_len_s"], rel=1e-6)
    assert r["mean_per_s"] <= r["peak_per_s"]
    assert {b["window_start_s"] for b in fr["thrashing"]["blocks"]} == {7.0}
    (w,) = fr["gpu_windows"]
    assert (w["window_start_s"], w["faults"]) == (7.0, 230_148)


@pytest.mark.parametrize("fixture", [CUDA, FRAG, THRASH], ids=lambda p: p.name)
def test_gpu_memory_size_comes_from_the_rm_heap(fixture: Path) -> None:
    """The manifest lists GPU 0 without a size; RM's heap size (139.8 GiB, = CUDA's
    own mem_total in gpu_workload's truth) stands in, and the reports say so."""
    assert "memory_bytes" not in open_trace(fixture / "trace").manifest["gpus"][0]
    heap = int(_table(fixture, "gpu_memory")["heap_size_bytes"].max())  # type: ignore[arg-type]
    doc = analyze(fixture / "trace", ["fault-rate", "summary"])
    o = doc["fault_rate"]["oversubscription"]
    assert (o["gpu_memory_bytes"], o["gpu_memory_source"], o["gpus_of_unknown_memory"]) == (
        heap, ["gpu_memory heap"], [])
    assert o["ratio"] == pytest.approx(o["managed_peak_bytes"] / heap, abs=1e-6)
    (g,) = doc["summary"]["gpus"]["gpus"]
    assert (g["memory_bytes"], g["memory_source"]) == (heap, "gpu_memory heap")
    assert g["peak_share"] == pytest.approx(g["peak_bytes"] / heap, abs=1e-6)


def test_cuda_gpu_memory_equals_cudas_mem_total(cuda_truth: dict[str, Any]) -> None:
    heap = int(_table(CUDA, "gpu_memory")["heap_size_bytes"].max())  # type: ignore[arg-type]
    assert heap == cuda_truth["init"]["mem_total"]


def test_resident_counts_blocks_the_gpu_touched_first(cuda_truth: dict[str, Any]) -> None:
    """gpu_workload: the CPU writes 64 MiB of a 256 MiB managed buffer, the kernel writes
    all 256 MiB (64 MiB migrate, 192 MiB are populated on the GPU by its faults, with no
    migration), the CPU reads 16 MiB back. thrash: the first kernel populates 16 MiB on
    the GPU; every CPU round takes it all back."""
    m = cuda_truth["managed"]
    (c,) = analyze(CUDA / "trace", ["fault-rate"])["fault_rate"]["oversubscription"][
        "resident_by_gpu"]
    assert c["resident_peak_bytes"] == m["gpu_write_bytes"] == 256 * MIB
    assert c["populated_bytes"] == m["gpu_write_bytes"] - m["cpu_write_bytes"]
    assert c["resident_end_bytes"] == m["gpu_write_bytes"] - m["cpu_read_bytes"]
    (t,) = analyze(THRASH / "trace", ["fault-rate"])["fault_rate"]["oversubscription"][
        "resident_by_gpu"]
    assert (t["resident_peak_bytes"], t["populated_bytes"], t["resident_end_bytes"]) == (
        THRASH_BYTES, THRASH_BYTES, 0)


def test_migration_size_classes_bound_every_migration() -> None:
    """cuda: 151 prefetch CPU->GPU migrations average ~317 KiB; they are '<=2MiB', and
    every class label is a true bound on the sizes it holds."""
    bounds = {"<=4KiB": (0, 4 * KIB), "<=64KiB": (4 * KIB, 64 * KIB),
              "<=2MiB": (64 * KIB, 2 * MIB), ">2MiB": (2 * MIB, 1 << 62)}
    for fixture in (CUDA, THRASH):
        rows = analyze(fixture / "trace", ["fault-rate"])["fault_rate"]["migrations"][
            "by_cause_direction_size"]
        sizes = _table(fixture, "migrations").with_columns(
            pl.col("size_bytes").cast(pl.Int64))
        for r in rows:
            lo, hi = bounds[r["size_class"]]
            mine = sizes.filter((pl.col("cause") == r["cause"]) & (pl.col("src") == r["src"])
                                & (pl.col("dst") == r["dst"])
                                & pl.col("size_bytes").is_between(lo + 1, hi))
            assert (mine.height, int(mine["size_bytes"].sum())) == (r["migrations"],
                                                                    r["bytes"]), r
    rows = analyze(CUDA / "trace", ["fault-rate"])["fault_rate"]["migrations"][
        "by_cause_direction_size"]
    (p,) = [r for r in rows if (r["cause"], r["direction"], r["size_class"])
            == ("prefetch", "cpu->gpu0", "<=2MiB")]
    assert p["migrations"] == 151 and 300 * KIB < p["bytes"] / 151 < 330 * KIB


def test_frag_max_row_is_each_columns_own_maximum() -> None:
    """thrash: the worst sample overall (0.1% unusable for 1 GiB at 7.5 s) is not where
    the 1 GiB column peaks (0.6% at the end): `max` holds each column's own maximum."""
    mem = _table(THRASH, "gpu_memory").filter(pl.col("status") == 0)
    free = pl.col("heap_free_bytes").cast(pl.Int64)
    largest = pl.col("largest_free_bytes").cast(pl.Int64)
    one_g = ((free - largest // GIB * GIB) / free).max()
    (g,) = analyze(THRASH / "trace", ["fragmentation"])["fragmentation"]["rm"]["gpus"]
    assert g["max"]["unusable_share_1g"] == pytest.approx(mem.select(one_g).item(), abs=1e-6)
    assert g["max"]["unusable_share_1g"] > g["worst"]["unusable_share_1g"]
    for col, v in g["max"].items():
        assert all(v >= s[col] for s in g["series"] if s[col] is not None), col
        assert v >= g["worst"][col] and v >= g["end"][col]


def test_reports_name_the_in_kernel_hooks_not_the_driver_layer(
        capsys: pytest.CaptureFixture[str]) -> None:
    """uvm_tools and rm_query (record's "driver layer") are present; only the in-kernel
    driver hooks (schema layer `driver`) are not, and the text must not say otherwise."""
    assert main(["analyze", str(THRASH / "trace"), "--only", "fault-rate,fragmentation"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "driver layer absent" not in out and "driver layers absent" not in out
    assert "in-kernel driver hooks" in out
    assert "the manifest lists no GPUs" not in out and "GPU memory unknown" not in out
