"""Who holds what, live: one figure per process (the joined model over its live
allocations: each piece of memory once, the layers never added), and the memory the
driver charges to pids no live traced process has (`gputrace_orphaned_bytes`, `--alert
orphaned>...`). Synthetic tables (gputrace.trace.builder), truth written beside each
scenario."""

from __future__ import annotations

from pathlib import Path

import pytest

from gputrace.live.aggregates import Aggregates
from gputrace.live.alerts import Alerts, parse_alert
from gputrace.live.metrics import LiveCollector
from gputrace.trace.builder import CLASS_DEVICE, MiB, TraceBuilder
from tests.unit.live.test_live_aggregates import Clock, feed

BASE = 0x7F0000000000


def _sub_allocating_process(b: TraceBuilder, pid: int) -> None:
    """As the stand-in driver (and the real one) does: each 2 MiB RM video-memory object
    is made inside a 1 MiB cuMemAlloc and mapped by UVM at its pointer; the next 1 MiB
    pointer lies in the same 2 MiB page. 12 objects, 23 pointers; a 6 MiB object made
    outside any call (the CUDA context); an 8 MiB managed allocation (its mmap made in
    the call, no RM object)."""
    dev = b.rm_alloc(0.0, pid, h_class=CLASS_DEVICE, gpu=0)
    b.rm_alloc(0.05, pid, size=6 * MiB, parent=dev)
    for i in range(12):
        t, base = 0.1 + i / 100, BASE + i * 2 * MiB
        b.cuda_alloc(t, pid, MiB, ptr=base)
        h = b.rm_alloc(t + 1e-6, pid, size=2 * MiB, parent=dev)
        b.uvm(t + 2e-6, pid, "UVM_CREATE_EXTERNAL_RANGE", base=base, length=2 * MiB)
        b.uvm(t + 3e-6, pid, "UVM_MAP_EXTERNAL_ALLOCATION", base=base, length=2 * MiB,
              h_object=h)
        if i < 11:
            b.cuda_alloc(t + 0.005, pid, MiB, ptr=base + MiB)
    managed = BASE + 64 * MiB
    b.cuda_alloc(0.3, pid, 8 * MiB, func="cuMemAllocManaged", ptr=managed)
    b.mmap_managed(0.3 + 1e-6, pid, managed, 8 * MiB)


def test_one_figure_per_process_never_the_layers_added() -> None:
    """Per layer: API 31 MiB (23 x 1 + 8 managed), RM 30 MiB (12 x 2 + 6), UVM 32 MiB
    (12 x 2 mapped + 8 managed). Each piece once: 24 (the RM objects the API pointers
    lie in) + 6 (context) + 8 (managed) = 38 MiB; the largest layer would say 32, the
    layers added 93. Growth and the live_bytes alert read the same figure; freeing the
    managed allocation (munmap) takes it down to 30 MiB."""
    b = TraceBuilder()  # synthetic
    b.process(100, "train")
    _sub_allocating_process(b, 100)
    agg = Aggregates(clock=Clock())
    feed(agg, b, "ioctls", "cuda_calls", "mappings")
    (p,) = agg.snapshot().procs
    assert p.live == {("rm", 0): 30 * MiB, ("api", None): 31 * MiB, ("uvm", None): 32 * MiB}
    assert p.held_bytes == 38 * MiB
    held = [(s.labels["pid"], s.value) for m in LiveCollector(agg.snapshot).collect()
            for s in m.samples if m.name == "gputrace_held_bytes"]
    assert held == [("100", 38 * MiB)]
    fired = Alerts([parse_alert("live_bytes>40MiB")], err=lambda _s: None).evaluate(
        agg.snapshot())
    assert fired == []  # 93 MiB added would have fired
    assert Alerts([parse_alert("live_bytes>35MiB")], err=lambda _s: None).evaluate(
        agg.snapshot())  # 32 MiB, the largest layer, would not
    b2 = TraceBuilder()
    b2.cuda_free(0.4, 100, BASE + 64 * MiB)
    b2.munmap(0.4 + 1e-6, 100, BASE + 64 * MiB, 8 * MiB)
    feed(agg, b2, "cuda_calls", "mappings")
    (p,) = agg.snapshot().procs
    assert p.held_bytes == 30 * MiB


def test_tables_in_any_order() -> None:
    """A managed mmap at an address (made and unmapped first) and an external mapping
    later at the same address arrive in two tables, the later one first, as a writer
    flushing per table may hand them over: each is its own allocation (2 made, the
    managed one ended; the stand-in libcuda's workload does this at one address)."""
    b = TraceBuilder()  # synthetic
    b.process(100, "train")
    b.mmap_managed(0.1, 100, BASE, 8 * MiB)
    b.munmap(0.2, 100, BASE, 8 * MiB)
    b.uvm(0.3, 100, "UVM_CREATE_EXTERNAL_RANGE", base=BASE, length=2 * MiB)
    b.uvm(0.3 + 1e-6, 100, "UVM_MAP_EXTERNAL_ALLOCATION", base=BASE, length=2 * MiB,
          h_object=7)
    agg = Aggregates(clock=Clock())
    feed(agg, b, "ioctls", "mappings")  # the external mapping first
    (p,) = agg.snapshot().procs
    assert (p.allocations["uvm"], p.frees["uvm"]) == (2, 1)
    assert p.live == {("uvm", None): 2 * MiB} and p.held_bytes == 2 * MiB


def test_live_figure_is_the_offline_figure(tmp_path: Path) -> None:
    """The same scenario written as a trace: the holders the offline model gives at its
    end (`oom`/`summary`'s joined model) equal the live figure."""
    from gputrace.analyses.allocations.held import by_holder, held_pieces
    from gputrace.analyses.helpers.inputs import inputs_from_trace
    from gputrace.analyses.helpers.partition import per_slice
    from gputrace.trace.reader import open_trace

    b = TraceBuilder()  # synthetic
    b.process(100, "train")
    _sub_allocating_process(b, 100)
    t = open_trace(b.build(tmp_path / "t"))
    (held,) = per_slice(inputs_from_trace(t), {"h": held_pieces})["h"]
    (row,) = by_holder(held, t.manifest["end_ts_ns"]).to_dicts()
    assert row["held_bytes"] == 38 * MiB
    assert (row["program_bytes"], row["cuda_context_bytes"]) == (32 * MiB, 6 * MiB)


def test_orphaned_bytes_from_the_drivers_accounting() -> None:
    """The driver charges 1 GiB to pid 100 (traced, live), 512 MiB to pid 200 (exited:
    its child keeps the context) and 256 MiB to pid 4242 (never seen: another PID
    namespace). Orphaned on GPU 0: 768 MiB; then a new round without pid 200: 256 MiB."""
    b = TraceBuilder()  # synthetic
    b.process(100, "train")
    b.process(200, "loader", exit=1.0)
    b.cuda_alloc(0.1, 100, MiB)
    b.gpu_process_memory(2.0, 0, 100, 1024 * MiB)
    b.gpu_process_memory(2.0, 0, 200, 512 * MiB)
    b.gpu_process_memory(2.0, 0, 4242, 256 * MiB)
    agg = Aggregates(clock=Clock())
    feed(agg, b, "cuda_calls", "processes", "gpu_process_memory")
    snap = agg.snapshot()
    assert snap.orphaned == {0: 768 * MiB}
    lines: list[str] = []
    alerts = Alerts([parse_alert("orphaned>512MiB")], err=lines.append)
    (f,) = alerts.evaluate(snap)
    assert f.value == 768 * MiB and "768.0 MiB" in lines[0]
    metrics = {(m.name, tuple(s.labels.items())): s.value
               for m in LiveCollector(agg.snapshot).collect() for s in m.samples}
    assert metrics[("gputrace_orphaned_bytes", (("gpu", "0"),))] == 768 * MiB
    b.gpu_process_memory(3.0, 0, 100, 1024 * MiB)
    b.gpu_process_memory(3.0, 0, 4242, 256 * MiB)
    feed(agg, b, "gpu_process_memory")
    assert agg.snapshot().orphaned == {0: 256 * MiB}
    assert alerts.evaluate(agg.snapshot()) == []


def test_large_live_sets_are_recomputed_at_most_once_per_their_size(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With more live allocations than HELD_ITEMS (4 here, 50,000 in the recorder), the
    figure is recomputed at most every HELD_NS per HELD_ITEMS, snapshots included: 9
    allocations of 1 MiB wait 2 s (9 // 4); with few, every snapshot is fresh."""
    from gputrace.live import aggregates

    monkeypatch.setattr(aggregates, "HELD_ITEMS", 4)
    clock = Clock()
    agg = Aggregates(clock=clock)
    b = TraceBuilder()  # synthetic
    b.process(100, "train")
    for i in range(3):
        b.cuda_alloc(0.1 + i / 100, 100, MiB)
    feed(agg, b, "cuda_calls")
    assert agg.snapshot().procs[0].held_bytes == 3 * MiB  # 3 items: fresh at once
    for i in range(6):
        b.cuda_alloc(0.2 + i / 100, 100, MiB)
    feed(agg, b, "cuda_calls")
    clock.t += aggregates.HELD_NS  # 9 items: 2 s since the last recompute is needed
    assert agg.snapshot().procs[0].held_bytes == 3 * MiB
    clock.t += aggregates.HELD_NS
    assert agg.snapshot().procs[0].held_bytes == 9 * MiB


def test_live_and_offline_name_a_call_alike() -> None:
    """A driver entry point's function, as the live aggregates and the offline
    lifetimes take it from its name: one rule (lifetimes.API_SUFFIX)."""
    import polars as pl

    from gputrace.analyses.helpers.lifetimes import _base_func
    from gputrace.live.live_bytes import _base

    names = ["cuMemAlloc_v2", "cuMemFreeAsync_ptsz", "cuMemAllocAsync_ptds",
             "cuMemAlloc_v2_ptsz", "cuMemCreate", "cuMemAllocManaged", "cuMemHostAlloc_v3",
             "cuMemFree_v", "cuMemRelease"]
    offline = pl.DataFrame({"func": names}).select(_base_func())["func"].to_list()
    assert [_base(n) for n in names] == offline
    assert offline[:4] == ["cuMemAlloc", "cuMemFreeAsync", "cuMemAllocAsync", "cuMemAlloc"]
