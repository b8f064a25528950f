"""Running aggregates fed synthetic tables (gputrace.trace.builder): live bytes per
layer, pairing, RM subtree frees, exits, growth and rates against hand-computed
truth. Synthetic data, labelled so."""

from __future__ import annotations

import pyarrow as pa
import pytest

from gputrace import schema
from gputrace.live.aggregates import NS, Aggregates
from gputrace.trace.builder import CLASS_DEVICE, CLASS_SUBDEVICE, MiB, TraceBuilder


class Clock:
    def __init__(self) -> None:
        self.t = 1000 * NS

    def __call__(self) -> int:
        return self.t


def feed(agg: Aggregates, b: TraceBuilder, *names: str) -> None:
    """Hand the builder's rows of each table to the aggregates, then clear them."""
    for name in names or tuple(schema.TABLES):
        rows = b.rows[name]
        if rows:
            t = pa.Table.from_pylist(rows, schema=schema.table(name).arrow_schema)
            agg.observe(name, t)
            rows.clear()


def test_api_live_bytes_pair_allocs_with_frees() -> None:
    b = TraceBuilder()  # synthetic
    b.process(100, "train")
    p1 = b.cuda_alloc(0.1, 100, 4 * MiB)
    b.cuda_alloc(0.2, 100, 1 * MiB)
    b.cuda_alloc(0.3, 100, 1 << 40, result=2)  # failed: never counts
    b.cuda_alloc(0.4, 100, 3 * MiB, func="cuMemAllocAsync_ptsz")
    b.cuda_free(0.5, 100, p1)
    b.cuda_free(0.6, 100, 0xDEAD)  # free of nothing we saw: no free counted
    agg = Aggregates(clock=Clock())
    feed(agg, b, "cuda_calls")
    s = agg.snapshot()
    (p,) = s.procs
    assert p.pid == 100 and p.comm == "train"
    assert p.live == {("api", None): 4 * MiB}
    assert p.allocations == {"api": 3} and p.frees == {"api": 1}


def test_rm_live_bytes_by_gpu_and_subtree_free() -> None:
    b = TraceBuilder()  # synthetic
    b.process(7, "job")
    dev1 = b.rm_alloc(0.0, 7, h_class=CLASS_DEVICE, gpu=1)
    sub = b.rm_alloc(0.0, 7, h_class=CLASS_SUBDEVICE, parent=dev1)
    m1 = b.rm_alloc(0.1, 7, size=2 * MiB, parent=dev1)
    b.rm_alloc(0.2, 7, size=4 * MiB, parent=dev1)
    b.rm_alloc(0.3, 7, size=8 * MiB, parent=sub)
    b.rm_alloc(0.4, 7, size=16 * MiB, parent=dev1, status=0x51)  # failed
    b.rm_alloc(0.5, 7, size=64 * MiB, h_class=0x50A0, parent=dev1)  # virtual: not memory
    b.rm_free(0.6, 7, handle=m1)
    agg = Aggregates(clock=Clock())
    feed(agg, b, "ioctls")
    (p,) = agg.snapshot().procs
    assert p.live == {("rm", 1): 12 * MiB}
    assert p.allocations == {"rm": 3} and p.frees == {"rm": 1}
    b.rm_free(0.7, 7, handle=dev1)  # the device's memory objects go with it
    feed(agg, b, "ioctls")
    (p,) = agg.snapshot().procs
    assert p.live == {("rm", 1): 8 * MiB}  # the one under the subdevice is kept
    b.rm_free(0.8, 7, handle=0xC1D00000)  # the client: everything
    feed(agg, b, "ioctls")
    (p,) = agg.snapshot().procs
    assert p.live == {} and p.frees == {"rm": 3}
    s = agg.snapshot()
    assert s.ioctls == {"RM_ALLOC": 7, "RM_FREE": 3}
    counts, total = s.ioctl_latency["RM_ALLOC"]
    assert sum(counts) == 7 and total == pytest.approx(7 * 2e-6)
    assert counts[1] == 7  # 2 us: in the (1 us, 4 us] bucket


def test_exit_removes_process_and_its_memory() -> None:
    b = TraceBuilder()  # synthetic
    b.process(5, "gone", exit=1.0)
    b.cuda_alloc(0.1, 5, MiB)
    agg = Aggregates(clock=Clock())
    feed(agg, b, "cuda_calls")
    assert agg.snapshot().procs[0].held_bytes == MiB
    feed(agg, b, "processes")
    s = agg.snapshot()
    assert s.procs == [] and s.exited == 1


def test_growth_is_gain_over_the_window_per_second() -> None:
    clock = Clock()
    agg = Aggregates(clock=clock, growth_window_ns=60 * NS)
    b = TraceBuilder()  # synthetic
    b.process(9, "leaky")
    b.cuda_alloc(0.0, 9, 30 * MiB)
    feed(agg, b, "cuda_calls")
    (p,) = agg.snapshot().procs
    assert p.growth_bytes_per_s == pytest.approx(30 * MiB / 60)
    clock.t += 30 * NS
    b.cuda_alloc(1.0, 9, 30 * MiB)
    feed(agg, b, "cuda_calls")
    assert agg.snapshot().procs[0].growth_bytes_per_s == pytest.approx(60 * MiB / 60)
    clock.t += 40 * NS  # the first 30 MiB is now older than the window
    assert agg.snapshot().procs[0].growth_bytes_per_s == pytest.approx(30 * MiB / 60)
    clock.t += 60 * NS
    assert agg.snapshot().procs[0].growth_bytes_per_s == 0


def test_rates_faults_migrations_gpu_memory() -> None:
    clock = Clock()
    agg = Aggregates(clock=clock)
    b = TraceBuilder()  # synthetic
    b.process(3, "uvm")
    for i in range(10):
        b.gpu_fault(0.1, 0, 0x1000 * i, pid=3)
    b.cpu_fault(0.1, 3, 0x2000, write=True)
    b.fault_batch(0.1, 0, 1, faults=10, duplicates=0, duration_s=1e-4, pid=3)
    b.migration(0.2, -1, 0, 0x1000, 2 * MiB, cause=1, pid=3)
    b.migration(0.3, 0, -1, 0x1000, 4 * MiB, cause=5, pid=3)
    b.gpu_memory(0.1, 0, heap=80 << 30, free=10 << 30, largest=2 << 30)
    b.gpu_memory(0.2, 0, heap=80 << 30, free=8 << 30, largest=2 << 30)
    feed(agg, b)
    clock.t += 2 * NS
    s = agg.snapshot()
    (p,) = s.procs
    assert p.gpu_faults == 10 and p.cpu_faults == 1 and p.migrations == 2
    assert p.gpu_fault_rate == pytest.approx(5.0)  # 10 faults, 2 s since first seen
    assert s.gpu_faults == {(0, "gpu_replayable"): 10} and s.cpu_faults == 1
    assert s.fault_batches == {0: 1}
    assert s.migrations == {"replayable_fault": (1, 2 * MiB), "eviction": (1, 4 * MiB)}
    (g,) = s.gpus
    assert g.free_bytes == 8 << 30 and g.largest_free_bytes == 2 << 30
    assert g.fragmentation == pytest.approx(0.75)
    assert s.rows["faults"] == 11


def test_stats_override_own_counts() -> None:
    agg = Aggregates(clock=Clock(), stats=lambda: {
        "rows": {"ioctls": 5}, "drops": {"ioctl_events": 2}, "cpu_seconds": 1.5,
        "rss_bytes": 1000})  # fmt: skip
    s = agg.snapshot()
    assert s.drops_total == 2 and s.rows == {"ioctls": 5}
    assert s.cpu_seconds == 1.5 and s.rss_bytes == 1000
