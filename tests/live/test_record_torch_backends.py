"""The torch_allocator layer, live, on the stand-in libc10_cuda.so's other two ways of
holding memory (tests/standin_torch), both chosen by PYTORCH_CUDA_ALLOC_CONF as in
PyTorch: expandable segments (pages mapped with cuMemCreate/cuMemMap as malloc needs
them, unmapped when the cache is emptied: `segment_map`/`segment_unmap` rows, the
mapped runs as expandable segments) and the cudaMallocAsync backend (mallocAsync and
freeAsync; a free deferred past a CUDA graph capture is requested at freeAsync and
completed at the cuMemFreeAsync of the next malloc); and the native allocator's
deferred free (a tensor another stream used: insert_events at its free, free_block when
the next malloc finds its events complete). One recording of three processes, checked
against what each program says it did (root, bcc)."""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl
import pytest

from gputrace.trace.reader import open_trace
from tests.record_helpers import live_skip_reason
from tests.standin_torch import standin_torch as st

pytestmark = [pytest.mark.live, pytest.mark.xdist_group("torch_backends_live")]
_SKIP = live_skip_reason()
if _SKIP is not None:
    pytestmark.append(pytest.mark.skip(reason=_SKIP))

KIB, MIB = 1 << 10, 1 << 20
CAP = "64M"  # the stand-in libcuda's largest allocation: the 96 MiB request fails
SMALL_PAGE, LARGE_PAGE = 2 * MIB, 20 * MIB  # PyTorch's expandable segments' page sizes


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, st.Run, st.Run, st.Run]:
    out = tmp_path_factory.mktemp("torch-backends") / "trace"
    lib = st.build()
    expandable, async_, streams = st.record_many(out, [
        (sys.executable, lib, ("--iterations", "3", "--empty-cache"),
         {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
        (sys.executable, lib, ("--iterations", "3", "--deferred", "--oom"),
         {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync",
          "GPUTRACE_STANDIN_CUDA_MAX": CAP}),
        (sys.executable, lib, ("--iterations", "2", "--streams"))])  # fmt: skip
    return out, expandable, async_, streams


def _events(trace: Path, pid: int) -> pl.DataFrame:
    return (open_trace(trace).scan("allocator_events").collect()
            .filter(pl.col("pid") == pid).sort("seq"))


def test_expandable_segments_pages_and_runs(recorded: tuple[Path, st.Run, st.Run, st.Run]) -> None:
    """Every page the allocator mapped is a `segment_map` row of its size, every page
    it unmapped a `segment_unmap` row; the pages left are, as in PyTorch's snapshot,
    one expandable segment per run of contiguous pages, whose bytes are the
    allocator's own count; every tensor and free exactly as the program made them."""
    trace, run, _, _ = recorded
    mapped, unmapped = run.pages
    # a small page, a large one (5 MiB of weights, 3 MiB activations), two more for the
    # 40 MiB burst past the cached activation, given back when the cache is emptied
    assert (mapped, unmapped) == (4, 2)
    ev = _events(trace, run.pid)
    maps = ev.filter(pl.col("action") == "segment_map")
    unmaps = ev.filter(pl.col("action") == "segment_unmap")
    assert maps.height == mapped and unmaps.height == unmapped
    assert sorted(maps["size_bytes"].to_list()) == [SMALL_PAGE] + [LARGE_PAGE] * (mapped - 1)
    assert unmaps["size_bytes"].to_list() == [LARGE_PAGE] * unmapped
    # the burst's last two pages (it began on the first large page, past the 5 MiB
    # weight and the cached 3 MiB activation), unmapped after its free
    burst = next(p for p, _n, w in run.tensors if w == "burst")
    first = burst - 8 * MIB
    assert sorted(unmaps["address"].to_list()) == [first + LARGE_PAGE, first + 2 * LARGE_PAGE]
    assert unmaps["ts_ns"].min() > ev.filter(pl.col("address") == burst)["ts_ns"].max() - 1
    assert set(unmaps["address"].to_list()) <= set(maps["address"].to_list())
    assert ev.filter(pl.col("action").is_in(["segment_alloc", "segment_free"])).height == 0
    allocs = ev.filter(pl.col("action") == "alloc")
    assert allocs.select("address", "size_bytes").rows() == [
        (p, st.block_round(n)) for p, n, _ in run.tensors]
    assert ev.filter(pl.col("action") == "free_completed")["address"].to_list() == run.freed
    t = open_trace(trace)
    segs = t.scan("allocator_segments").collect().filter(pl.col("pid") == run.pid)
    assert segs["is_expandable"].to_list() == [True, True]
    assert sorted(segs["total_size_bytes"].to_list()) == [SMALL_PAGE, LARGE_PAGE]
    assert segs["total_size_bytes"].sum() == run.reserved
    assert segs["allocated_size_bytes"].sum() == run.allocated
    # each segment starts at its first page; the pages mapped minus unmapped are in it
    left = set(maps["address"].to_list()) - set(unmaps["address"].to_list())
    assert set(segs["address"].to_list()) == left


def test_reports_read_both(recorded: tuple[Path, st.Run, st.Run, st.Run]) -> None:
    """The allocator reports over both processes: the pool's bytes are the two
    allocators' own counts added, the planted tensors alive at the end are found by
    their line in each (three iterations each)."""
    trace, expandable, async_, streams = recorded
    runs = (expandable, async_, streams)
    pool = st.analyze_json(trace, "allocator-pool")["allocator_pool"]
    assert pool["reserved_bytes"] == sum(r.reserved for r in runs)
    assert pool["allocated_bytes"] == sum(r.allocated for r in runs)
    tens = st.analyze_json(trace, "tensors")["tensors"]
    leak = f"step ({st.WORKLOAD}:{st.plant_line('leak')})"
    rows = {s["pid"]: s for s in tens["by_stack"] if s["site"] == leak}  # one per process
    assert {p: (r["count"], r["bytes"]) for p, r in rows.items()} == {
        expandable.pid: (3, 3 * 256 * KIB), async_.pid: (3, 3 * 256 * KIB),
        streams.pid: (2, 2 * 256 * KIB)}
    assert tens["pending_free_count"] == 1 and tens["pending_free_bytes"] == streams.pending


def test_async_backend_tensors_and_deferred_free(
        recorded: tuple[Path, st.Run, st.Run, st.Run]) -> None:
    """mallocAsync's tensors at the size asked (the driver rounds, not PyTorch); each
    free requested at freeAsync and completed at its cuMemFreeAsync: at once, except
    the tensor freed during the capture, completed inside the next malloc (after its
    entry); the out-of-memory request on its line; the state at the end is the
    backend's own count (alive, pending)."""
    trace, _, run, _ = recorded
    ev = _events(trace, run.pid)
    allocs = ev.filter(pl.col("action") == "alloc")
    assert allocs.select("address", "size_bytes").rows() == [(p, n) for p, n, _ in run.tensors]
    req = ev.filter(pl.col("action") == "free_requested")
    done = ev.filter(pl.col("action") == "free_completed")
    assert req["address"].to_list() == run.freed
    assert done["address"].to_list() == run.freed
    early = next(p for p, _n, w in run.tensors if w == "early")
    after_ts = allocs["ts_ns"][[w for _p, _n, w in run.tensors].index("after")]
    req_ts = req.filter(pl.col("address") == early)["ts_ns"][0]
    done_ts = done.filter(pl.col("address") == early)["ts_ns"][0]
    assert req_ts < after_ts < done_ts  # deferred: given back inside the next malloc
    for r, d in zip(req.rows(named=True), done.rows(named=True), strict=True):
        if r["address"] != early:  # the others: given back by freeAsync itself
            assert r["seq"] + 1 == d["seq"] and r["size_bytes"] == d["size_bytes"]
    oom = ev.filter(pl.col("action") == "oom")
    assert oom["size_bytes"].to_list() == [96 * MIB]
    t = open_trace(trace)
    frames = t.scan("allocator_frames").filter(pl.col("stack_id") == oom["stack_id"][0]
                                               ).collect().sort("depth")
    assert frames["function"][0] == "too_big"
    assert frames["line"][0] == st.plant_line("oom")
    segs = t.scan("allocator_segments").collect().filter(pl.col("pid") == run.pid)
    assert set(segs["pool"].to_list()) == {"async"}
    assert segs["total_size_bytes"].sum() == run.reserved
    assert segs["allocated_size_bytes"].sum() == run.allocated
    libs = t.manifest["torch_allocator"]["libraries"]
    assert all(x["backends"] == ["native", "cudaMallocAsync"] for x in libs)


def test_native_free_deferred_by_another_stream(
        recorded: tuple[Path, st.Run, st.Run, st.Run]) -> None:
    """The 1 MiB tensor a side stream used: its free requested at free, completed
    inside the next malloc (its free_block, after that malloc's entry and before the
    tensor after it); the 2 KiB one freed last, still waiting: requested, never
    completed, an `active_pending_free` block at the end, out of the segment's
    allocated bytes and in its active ones. Every other free completed at once."""
    trace, _, _, run = recorded
    ev = _events(trace, run.pid)
    allocs = ev.filter(pl.col("action") == "alloc")
    assert allocs.select("address", "size_bytes").rows() == [
        (p, st.block_round(n)) for p, n, _ in run.tensors]
    where = [w for _p, _n, w in run.tensors]
    shared, held = (run.tensors[where.index(w)][0] for w in ("shared", "held"))
    req = ev.filter(pl.col("action") == "free_requested")
    done = ev.filter(pl.col("action") == "free_completed")
    assert req["address"].to_list() == run.freed
    assert sorted(done["address"].to_list()) == sorted(a for a in run.freed if a != held)
    t_next, t_held = (allocs["ts_ns"][where.index(w)] for w in ("next", "held"))
    assert req.filter(pl.col("address") == shared)["ts_ns"][0] < t_next
    assert t_next < done.filter(pl.col("address") == shared)["ts_ns"][0] < t_held
    for a in run.freed:
        if a not in (shared, held):
            r = req.filter(pl.col("address") == a)
            d = done.filter(pl.col("address") == a)
            assert r["ts_ns"].to_list() == d["ts_ns"].to_list()
    t = open_trace(trace)
    blocks = t.scan("allocator_blocks").collect().filter(pl.col("pid") == run.pid)
    pending = blocks.filter(pl.col("state") == "active_pending_free")
    assert pending.select("address", "size_bytes").rows() == [(held, run.pending)]
    segs = t.scan("allocator_segments").collect().filter(pl.col("pid") == run.pid)
    assert segs["allocated_size_bytes"].sum() == run.allocated
    assert segs["active_size_bytes"].sum() == run.allocated + run.pending
    assert segs["total_size_bytes"].sum() == run.reserved
