"""Tests that kill the mutants of the analyses that survived the mutation sample
(docs/testing.md, "Mutation testing"): each asserts an independent truth, a value
planted in a small hand-made input (synthetic) or a figure computed by hand, and
names in its docstring what it pins. Grouped by module; fast and in-process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from gputrace.analyses import fail_on
from gputrace.analyses.allocations.rows import rows
from gputrace.analyses.diff import diff
from gputrace.analyses.fault_rate import fault_rate
from gputrace.analyses.fault_rate.uvm_events import driver_thrashing
from gputrace.analyses.fragmentation import gpu_memory
from gputrace.analyses.helpers.common import chunk_bytes, size_class
from gputrace.analyses.helpers.inputs import Inputs, _data_span, inputs_from_trace
from gputrace.analyses.helpers.lifetimes import lifetimes, memory
from gputrace.analyses.helpers.rm_objects import rm_lifetimes
from gputrace.analyses.helpers.stacks import stack_frames
from gputrace.analyses.leaks import leaks
from gputrace.analyses.run import run_reports, unmeasured
from gputrace.analyses.summary import summary
from gputrace.analyses.timeseries import plot_series
from gputrace.analyses.timeseries.memory_over_time import gpu_bytes
from gputrace.trace.builder import MiB, TraceBuilder
from gputrace.trace.reader import open_trace
from tests.analyze_helpers import SCENARIO_DIR

US = 1_000


# ---------------------------------------------------------------------------- diff
def _doc(ioctls: list[dict[str, Any]]) -> dict[str, Any]:
    return {"summary": {"processes": [], "gpus": {"gpus": []}, "ioctls": ioctls},
            "leaks": {"recorded": True, "total_bytes": 0}, "fault_rate": {"rates": []}}


def _ioctl(name: str, p99_us: int, count: int = 10) -> dict[str, Any]:
    return {"name": name, "device": "ctl", "gpu_index": None, "count": count, "failed": 0,
            "latency_ns_p50": 5 * US, "latency_ns_p90": 8 * US,
            "latency_ns_p99": p99_us * US, "latency_ns_max": p99_us * US}


def test_diff_ioctl_latency_rows_from_each_summary() -> None:
    """diff: the ioctl latency of each command comes from each document's summary; a
    p99 that rose from 9 to 12 us is one changed row, an unchanged command none."""
    before = _doc([_ioctl("RM_CONTROL", 9), _ioctl("RM_ALLOC", 3)])
    after = _doc([_ioctl("RM_CONTROL", 12), _ioctl("RM_ALLOC", 3)])
    d = diff(before, after, [], [])
    (row,) = d["ioctl_latency"]
    assert (row["name"], row["device"], row["gpu_index"], row["status"]) == (
        "RM_CONTROL", "ctl", None, "changed")
    p99 = row["latency_ns_p99"]
    assert (p99["before"], p99["after"], p99["delta"]) == (9 * US, 12 * US, 3 * US)
    assert abs(p99["delta_pct"] - 100 / 3) < 1e-9
    assert row["count"]["delta"] == 0
    assert d["changed"] is True
    assert diff(before, before, [], [])["changed"] is False


# ------------------------------------------------------------------------- fail_on
def test_fail_on_thrashing_hit_counts_block_windows() -> None:
    """fail_on.thrashing_hit: two thrashing block-windows in the fault-rate report fail
    the run with their count; none, or a trace without the driver layer, does not."""
    rep = {"thrashing": {"blocks": [{"block_2m": 0}, {"block_2m": 2 * MiB}]}}
    assert fail_on.thrashing_hit(rep, 0.0) == "thrashing: 2 block-windows"
    assert fail_on.thrashing_hit({"thrashing": {"blocks": []}}, 0.0) is None
    assert fail_on.thrashing_hit({"thrashing": None}, 0.0) is None
    assert fail_on.thrashing_blind({"thrashing": None}) is not None
    assert fail_on.thrashing_blind(rep) is None


def test_fail_on_leaks_hit_only_when_something_leaked() -> None:
    """fail_on.leaks_hit: 3 leaked allocations of 12 bytes fail the run; 0 does not."""
    assert fail_on.leaks_hit({"total_count": 3, "total_bytes": 12}, 0.0) == (
        "leaks: 3 leaked allocations (12 bytes)")
    assert fail_on.leaks_hit({"total_count": 0, "total_bytes": 0}, 0.0) is None


def test_fail_on_fragmentation_reads_pmm_and_rm_gpus() -> None:
    """fail_on.fragmentation_hit: the worst index over PMM chunks (peak, end) and RM
    samples (worst unusable share) is compared with the threshold, strictly."""
    rep = {"gpus": [{"peak": {"fragmentation_index": 0.25}, "end": None}],
           "rm": {"gpus": [{"worst": {"unusable_share": 0.5}}]}}
    assert fail_on.fragmentation_hit(rep, 0.4) == "fragmentation: index 0.500 > 0.4"
    assert fail_on.fragmentation_hit(rep, 0.5) is None
    pmm_only = {"gpus": [{"peak": {"fragmentation_index": 0.25}}], "rm": None}
    assert fail_on.fragmentation_hit(pmm_only, 0.2) == "fragmentation: index 0.250 > 0.2"


# ----------------------------------------------------------------- helpers.inputs
class _Trace:
    """A stand-in for tracedir.Trace with the attributes inputs_from_trace reads."""

    def __init__(self, manifest: dict[str, Any], tables: dict[str, pl.LazyFrame]) -> None:
        self.manifest, self._tables = manifest, tables
        self.layers, self.status, self.drops = ["syscall"], "complete", {}

    def scan(self, name: str) -> pl.LazyFrame:
        return self._tables.get(name, pl.LazyFrame({"ts_ns": []}, schema={"ts_ns": pl.Int64}))


def _stamps(*ts: int) -> pl.LazyFrame:
    return pl.LazyFrame({"ts_ns": list(ts)}, schema={"ts_ns": pl.Int64})


def test_data_span_is_first_and_last_event_of_any_table() -> None:
    """inputs._data_span: the earliest and the latest ts_ns over the event tables
    (ioctls 5..9, faults 3..7: 3 and 9); no rows at all: (None, None)."""
    assert _data_span({"ioctls": _stamps(5, 9), "faults": _stamps(7, 3)}) == (3, 9)
    assert _data_span({"ioctls": _stamps()}) == (None, None)


def test_span_missing_from_the_manifest_is_taken_from_the_rows() -> None:
    """inputs_from_trace: a manifest without start/end takes the rows' span (100..250);
    one with a start only keeps it and takes the end from the rows; GPU memory sizes
    come in index order."""
    tables = {"ioctls": _stamps(100, 250), "mappings": _stamps(180)}
    gpus = [{"index": 1, "memory_bytes": 2}, {"index": 0, "memory_bytes": 1}]
    inp = inputs_from_trace(_Trace({"gpus": gpus}, tables))
    assert (inp.start_ns, inp.end_ns) == (100, 250)
    assert inp.gpu_memory_bytes == (1, 2)
    assert inp.layers == ("syscall",) and inp.problems == ()
    inp = inputs_from_trace(_Trace({"start_ts_ns": 50}, tables))
    assert (inp.start_ns, inp.end_ns) == (50, 250)
    inp = inputs_from_trace(_Trace({}, {}))
    assert (inp.start_ns, inp.end_ns) == (0, 0)


# ---------------------------------------------------------------------- gpu_memory
def test_long_gpu_memory_series_bucketed_per_gpu() -> None:
    """gpu_memory.series: 400 samples of GPU 0 and 3 of GPU 1 over 400 ns become equal
    buckets of 2 ns per GPU (SERIES_MAX 200): each keeps its first time, least free
    memory, smallest largest region and worst share; GPU 1's 3 samples stay 3 rows."""
    ts = [*range(400), 10, 200, 399]
    gpu = [0] * 400 + [1] * 3
    s = pl.DataFrame({
        "gpu_index": gpu, "ts_ns": ts, "t_s": [t / 1e9 for t in ts],
        "heap_size_bytes": [1000] * 403, "heap_free_bytes": [1000 - t for t in ts],
        "largest_free_bytes": [500 - t for t in ts], "largest_free_base_bytes": ts,
        "unusable_share": [t / 1000 for t in ts]})
    out = gpu_memory.series(s, 400, 0)
    assert "ts_ns" not in out.columns and out.columns == s.drop("ts_ns").columns
    g0 = out.filter(pl.col("gpu_index") == 0)
    assert g0.height == gpu_memory.SERIES_MAX == 200
    k = 7  # the bucket of samples 14 and 15
    row = g0.row(k, named=True)
    assert (row["t_s"], row["heap_free_bytes"], row["largest_free_bytes"],
            row["largest_free_base_bytes"], row["unusable_share"]) == (
        14 / 1e9, 1000 - 15, 500 - 15, 15, 15 / 1000)
    g1 = out.filter(pl.col("gpu_index") == 1)
    assert g1["heap_free_bytes"].to_list() == [990, 800, 601]


# ------------------------------------------------------------------ helpers.common
def test_chunk_bytes_is_two_to_the_log2_size_in_64_bits() -> None:
    """common.chunk_bytes: 2 ** log2_size as Int64, exact past 2**31 (4 KiB, 2 MiB,
    2 GiB, 1 TiB for 12, 21, 31, 40)."""
    df = pl.DataFrame({"log2_size": [12, 21, 31, 40]}, schema={"log2_size": pl.UInt8})
    out = df.select(b=chunk_bytes())["b"]
    assert out.dtype == pl.Int64
    assert out.to_list() == [4096, 2 * MiB, 2 * 1024 * MiB, 1024**4]


# ------------------------------------------------------------------------------ run
def test_unmeasured_gates_name_the_missing_layers() -> None:
    """run.unmeasured: a --fail-on gate whose report was not recorded names that report's
    missing layers; a recorded fault-rate report without thrashing (no driver layer)
    is blind to thrashing; a report not asked for is refused elsewhere (nothing here)."""
    doc = {"leaks": {"recorded": False, "not_recorded_layers": ["api", "syscall"]},
           "fault_rate": {"recorded": True, "thrashing": None}, "fragmentation": None}
    conds = [("leaks", 0.0), ("thrashing", 0.0), ("fragmentation", 0.5)]
    assert unmeasured(doc, conds) == ["leaks (layer api, syscall not recorded)",
                                      "thrashing (layer driver not recorded)"]
    doc["leaks"] = {"recorded": False, "not_recorded_layers": []}
    assert unmeasured(doc, conds[:1]) == ["leaks (layer needed not recorded)"]


# ----------------------------------------------------------------------- timeseries
def test_plot_rates_use_the_reports_window() -> None:
    """timeseries.plot_series: the fault rates are drawn in buckets of the fault-rate
    report's window (1 s over uvm_storm's 4 s: 4 buckets), so plot and table agree;
    run_reports says the trace lasted those 4 s."""
    inp = inputs_from_trace(open_trace(SCENARIO_DIR / "uvm_storm"))
    doc = run_reports(inp, ["fault-rate"])
    assert doc["fault_rate"]["window_s"] == 1.0
    assert doc["trace"]["duration_s"] == 4.0
    fr = plot_series(inp, doc)["fault_rates"]
    assert fr["bucket_s"] == 1.0
    (batches,) = fr["fault_batches"]["series"]
    assert batches["t_s"] == [0.0, 1.0, 2.0, 3.0] and batches["events"] == 2
    assert sum(batches["per_s"]) == 2.0  # buckets of 1 s: per second = count


# -------------------------------------------------------------------- driver_events
def test_driver_thrashing_region_first_and_last_report() -> None:
    """driver_events.driver_thrashing: a region the driver reported thrashing at 1.5 s
    and 2.5 s (start at 1000 s) is one row: 2 events, first 1.5 s, last 2.5 s, its
    processors; a throttling event is not thrashing."""
    t0 = 1_000 * 10**9
    ev = pl.LazyFrame({
        "kind": ["thrashing", "thrashing", "throttling_start"], "pid": [7, 7, 7],
        "address": [2 * MiB] * 3, "size_bytes": [2 * MiB] * 3,
        "processors": [None, "0,1", None],
        "ts_ns": [t0 + 2_500_000_000, t0 + 1_500_000_000, t0 + 100]})
    (row,) = driver_thrashing(ev, t0).collect().to_dicts()
    assert row == {"pid": 7, "address": 2 * MiB, "size_bytes": 2 * MiB, "events": 2,
                   "processors": "0,1", "first_s": 1.5, "last_s": 2.5}


# ------------------------------------------------------------------ helpers.stacks
def test_stack_frames_symbols_then_module_offset_then_ip() -> None:
    """stacks.stack_frames: frames innermost first joined by ' < '; a frame without a
    symbol is written as perf does, module basename + 0xoffset, else 0xip."""
    st = pl.LazyFrame({
        "pid": [1, 1, 1], "stack_id": [5, 5, 5], "depth": [2, 0, 1],
        "ip": [0x401000, 0x7F00AB, 0xDEAD], "module": [None, "/usr/lib/libcuda.so.1", None],
        "offset": [None, 0x1F2, None], "symbol": ["main", None, None],
        "kind": ["native"] * 3, "function": [None] * 3, "filename": [None] * 3,
        "line": [None] * 3},
        schema={"pid": pl.Int32, "stack_id": pl.Int64, "depth": pl.Int32, "ip": pl.UInt64,
                "module": pl.String, "offset": pl.UInt64, "symbol": pl.String,
                "kind": pl.String, "function": pl.String, "filename": pl.String,
                "line": pl.Int32})
    (row,) = stack_frames(st).collect().to_dicts()
    # the site: the first frame of the user's code (libcuda's and the unknown are not)
    assert row == {"pid": 1, "stack_id": 5, "frames": "libcuda.so.1+0x1f2 < 0xdead < main",
                   "site": "main"}


# ------------------------------------------------------------------ helpers.common
def test_size_classes_at_each_edge() -> None:
    """common.size_class: each class includes its upper edge (4 KiB, 64 KiB, 2 MiB,
    32 MiB, 512 MiB) and the next byte is in the next class; past 512 MiB, '>512MiB'."""
    edges = [4096, 64 * 1024, 2 * MiB, 32 * MiB, 512 * MiB]
    sizes = [s + d for s in edges for d in (0, 1)]
    got = pl.DataFrame({"size_bytes": sizes}).select(c=size_class())["c"].to_list()
    assert got == ["<=4KiB", "<=64KiB", "<=64KiB", "<=2MiB", "<=2MiB", "<=32MiB",
                   "<=32MiB", "<=512MiB", "<=512MiB", ">512MiB"]


# ----------------------------------------------------------------------- fault_rate
def test_fault_rate_top_cuts_the_busiest_gpu_windows() -> None:
    """fault_rate.fault_rate(top=2): the two busiest GPU fault windows of the
    fault_rates scenario, GPU 1's 20 faults at 2 s then GPU 0's 7 at 4 s (the first of
    its two windows of 7); without top, all four (20, 7, 7, 3)."""
    inp = inputs_from_trace(open_trace(SCENARIO_DIR / "fault_rates"))
    top = fault_rate(inp, top=2).to_json()["gpu_windows"]
    assert [(w["gpu_index"], w["pid"], w["faults"], w["window_start_s"]) for w in top] == [
        (1, 8001, 20, 2.0), (0, 8000, 7, 4.0)]
    every = fault_rate(inp).to_json()["gpu_windows"]
    assert [(w["faults"], w["window_start_s"]) for w in every] == [
        (20, 2.0), (7, 4.0), (7, 6.0), (3, 0.0)]


# -------------------------------------------------------------------------- summary
def test_summary_computed_from_its_own_slices() -> None:
    """summary.summary(inp) without precomputed parts: training_leak's pid 1000 peaks at
    256 MiB + 19 leaked 8 MiB caches (408 MiB) and holds 20 x 8 MiB = 160 MiB at the
    end, over 40 allocations."""
    inp = inputs_from_trace(open_trace(SCENARIO_DIR / "training_leak"))
    (p,) = summary(inp).to_json()["processes"]
    assert (p["layer"], p["pid"], p["comm"], p["allocations"], p["peak_bytes"],
            p["live_end_bytes"]) == ("api", 1000, "train", 40, 408 * MiB, 160 * MiB)


# ---------------------------------------------------------------------------- leaks
def test_leaks_computed_from_its_own_slices() -> None:
    """leaks.leaks(inp) without precomputed parts: training_leak leaks its 20 caches of
    8 MiB (160 MiB) from one process."""
    inp = inputs_from_trace(open_trace(SCENARIO_DIR / "training_leak"))
    rep = leaks(inp).to_json()
    assert (rep["recorded"], rep["total_count"], rep["total_bytes"]) == (True, 20, 160 * MiB)


def test_leaks_not_recorded_without_allocation_layers() -> None:
    """leaks.leaks: a trace of the driver layer only has no allocation layer: the leak
    report says so by name, listing api and syscall as missing."""
    inp = Inputs(tables={}, layers=("driver",), start_ns=0, end_ns=10)
    rep = leaks(inp).to_json()
    assert (rep["recorded"], rep["not_recorded_layers"]) == (False, ["api", "syscall"])
    assert rep["warnings"][0] == ("leaks: layer(s) api, syscall not recorded in this trace; "
                                  "nothing was measured")


# ----------------------------------------------------------------- memory_over_time
def test_gpu_bytes_fall_when_a_chunk_is_evicted_or_freed(tmp_path: Path) -> None:
    """memory_over_time.gpu_bytes: GPU 0 allocates three 2 MiB root chunks at 1 s, one
    is evicted at 2 s and one freed at 3 s (a split changes nothing): 6, 4, 2 MiB."""
    b = TraceBuilder(layers=("syscall", "driver"), duration_s=4.0)
    b.process(9, "p")
    for k in range(3):
        b.chunk(1.0, 0, "alloc", k * 2 * MiB, 21, pid=9)
    b.chunk(1.5, 0, "split", 0, 21, pid=9)
    b.chunk(2.0, 0, "evict", 0, 21, pid=9)
    b.chunk(3.0, 0, "free", 2 * MiB, 21, pid=9)
    g = gpu_bytes(inputs_from_trace(open_trace(b.build(tmp_path / "t"))))
    (s,) = g["series"]
    assert g["source"] == "pmm chunks"
    at = dict(zip(s["t_s"], s["values"], strict=True))  # the last value at each time
    assert (max(s["values"]), at[1.5], at[2.0], at[3.0]) == (6 * MiB, 6 * MiB, 4 * MiB,
                                                              2 * MiB)


# ------------------------------------------------------------------ allocation_rows
def test_rows_say_who_freed_each_allocation(tmp_path: Path) -> None:
    """allocation_rows.rows: who ended each memory row: the program (freed at 1 s),
    process exit (pid 2 exits at 2 s holding 4 MiB) or never (pid 1 holds 8 MiB at
    the trace end)."""
    b = TraceBuilder(layers=("syscall", "api"), duration_s=3.0)
    b.process(1, "keeper")
    b.process(2, "quitter", exit=2.0)
    p = b.cuda_alloc(0.5, 1, 1 * MiB)
    b.cuda_free(1.0, 1, p)
    b.cuda_alloc(0.6, 1, 8 * MiB)
    b.cuda_alloc(0.7, 2, 4 * MiB)
    inp = inputs_from_trace(open_trace(b.build(tmp_path / "t")))
    r = rows(memory(lifetimes(inp)).collect(), inp.scan("processes"), inp.end_ns)
    got = sorted(zip(r["pid"], r["size_bytes"], r["who"], strict=True))
    assert got == [(1, 1 * MiB, "program"), (1, 8 * MiB, "never"),
                   (2, 4 * MiB, "process exit")]


# -------------------------------------------------------------- helpers.rm_objects
def test_vid_heap_allocation_labelled_whatever_its_class_field(tmp_path: Path) -> None:
    """rm_objects.rm_lifetimes: a RM_VID_HEAP_CONTROL allocation (function 2, 6 MiB) is
    memory labelled 'vid heap' even with a class field that names no memory class
    (0x80, a device); a vidmem object is labelled by its class."""
    b = TraceBuilder(layers=("syscall",), duration_s=3.0)
    b.process(5, "heap")
    c = 0xC3300000
    b.rm_alloc(0.1, 5, h_class=0x41, handle=c, client=c, parent=0)
    b.ioctl(1.0, 5, "RM_VID_HEAP_CONTROL", cmd=0xC0B8464A, nr=0x4A, h_client=c, h_parent=c,
            h_object=0xD0000001, h_class=0x80, ctrl_cmd=2, size_bytes=6 * MiB, flags=0,
            attr=0)
    b.rm_alloc(1.5, 5, size=2 * MiB, client=c, parent=c)
    inp = inputs_from_trace(open_trace(b.build(tmp_path / "t")))
    lt = rm_lifetimes(inp.scan("ioctls"), inp.scan("files")).collect()
    got = sorted(zip(lt["layer"], lt["what"], lt["size_bytes"], strict=True))
    assert got == [("rm", "vid heap", 6 * MiB), ("rm", "vidmem 0x40", 2 * MiB)]
