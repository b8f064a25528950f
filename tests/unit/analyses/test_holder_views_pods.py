"""Every "who holds what" view reads the joined allocation model, with pods and two
processes (tests/recorded/test_holder_views.py: the recorded stand-in trace): on one
trace whose truth is one number per process (each piece of memory once, whatever the
layers that saw it), each view's figure per process, and its total, equals that number.

The trace (synthetic, gputrace.trace.builder; truth written beside it): two processes,
each with a CUDA context and API allocations inside RM video-memory objects that UVM
maps at the API pointers, so the API, RM and UVM layers each see the same bytes:

- train (pid 100, pod trainer-0): 3 RM objects of 4 MiB, each holding a 3 MiB
  cuMemAlloc at its base; a 2 MiB context object with no API allocation. Holds 14 MiB
  (12 program + 2 CUDA context); the API layer alone shows 9, RM 14, UVM 12.
- eval (pid 200, pod eval-0): one 8 MiB RM object holding a 5 MiB cuMemAlloc, then a
  1 TiB cuMemAlloc fails for want of memory at 9 s (an out-of-memory incident). Holds
  8 MiB.

Views: the leak report's held at end and `--by pod`, the summary's held memory and
`--by pod`, the out-of-memory report's holders at the incident, the live view and
metrics (`top`, `record --live`: gputrace_held_bytes), the fleet's holders.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gputrace.live.aggregates import Aggregates
from gputrace.live.metrics import LiveCollector
from gputrace.trace.builder import CLASS_DEVICE, MiB, TraceBuilder
from gputrace.trace.reader import open_trace
from tests.analyze_helpers import analyze
from tests.unit.live.test_live_aggregates import Clock, feed

TRUTH = {100: 14 * MiB, 200: 8 * MiB}
POD = {100: "trainer-0", 200: "eval-0"}


def build(b: TraceBuilder, path: Path) -> Path:
    for pid, comm in ((100, "train"), (200, "eval")):
        b.process(pid, comm, pod_uid=f"uid-{pid}", pod_namespace="ml", pod_name=POD[pid])
        b.open_fd(0.05, pid, fd=3)
    dev = {pid: b.rm_alloc(0.1, pid, h_class=CLASS_DEVICE, gpu=0) for pid in TRUTH}
    base = 0x7F00_0000_0000
    for i, (pid, rm, api) in enumerate([(100, 4, 3), (100, 4, 3), (100, 4, 3), (200, 8, 5)]):
        t, ptr = 1.0 + i, base + i * 16 * MiB
        h = b.rm_alloc(t, pid, size=rm * MiB, parent=dev[pid])
        b.uvm(t + 0.01, pid, "UVM_CREATE_EXTERNAL_RANGE", base=ptr, length=rm * MiB)
        b.uvm(t + 0.02, pid, "UVM_MAP_EXTERNAL_ALLOCATION", base=ptr, length=rm * MiB,
              h_object=h)
        b.cuda_alloc(t + 0.03, pid, api * MiB, ptr=ptr, stack=[f"site{i}", "main"])
    b.rm_alloc(6.0, 100, size=2 * MiB, parent=dev[100])  # the context: no API allocation
    b.cuda_alloc(9.0, 200, 1 << 40, result=2, stack=["grow", "main"])  # out of memory
    return b.build(path)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    b = TraceBuilder(("syscall", "api"), duration_s=10.0)  # synthetic
    path = build(b, tmp_path_factory.mktemp("views") / "t")
    agg = Aggregates(clock=Clock())
    feed(agg, b, "processes", "ioctls", "cuda_calls")
    doc = analyze(path, ["leaks", "summary", "oom"], by="pod")
    return {"path": path, "doc": doc, "agg": agg}


def test_the_leak_reports_held_at_end(world: dict[str, Any]) -> None:
    held = world["doc"]["leaks"]["held_at_end"]
    assert {r["pid"]: r["held_bytes"] for r in held["processes"]} == TRUTH
    assert held["bytes"] == sum(TRUTH.values())
    got = {r["pod_name"]: r["held_bytes"] for r in world["doc"]["leaks"]["by_pod"]}
    assert got == {POD[p]: b for p, b in TRUTH.items()}


def test_the_summarys_held_memory(world: dict[str, Any]) -> None:
    s = world["doc"]["summary"]
    assert {r["pid"]: r["live_end_bytes"] for r in s["held"]} == TRUTH
    assert {r["pid"]: r["peak_bytes"] for r in s["held"]} == TRUTH  # nothing was freed
    assert {r["pid"]: r["cuda_context_bytes"] for r in s["held"]} == {100: 2 * MiB, 200: 0}
    got = {r["pod_name"]: (r["live_end_bytes"], r["sum_of_peaks_bytes"]) for r in s["by_pod"]}
    assert got == {POD[p]: (b, b) for p, b in TRUTH.items()}
    # the per-layer table is a breakdown: its layers add up to more than the truth
    per_layer = sum(r["live_end_bytes"] for r in s["processes"] if r["pid"] == 100)
    assert per_layer > TRUTH[100]


def test_the_out_of_memory_holders(world: dict[str, Any]) -> None:
    (inc,) = world["doc"]["oom"]["incidents"]
    got = {h["pid"]: h["held_bytes"] for h in inc["holders"]}
    assert got == TRUTH
    # each holder names its pod (`--by pod`): the figures per pod are the same
    assert {h["pod_name"]: h["held_bytes"] for h in inc["holders"]} == {
        POD[p]: b for p, b in TRUTH.items()}
    # each piece once in the sites (sized by its RM object), whatever its layers; the
    # report lists 3 sites, train's context object is the fourth
    sites = {h["pid"]: [(s["site"], s["layer"], s["bytes"]) for s in h["top_sites"]]
             for h in inc["holders"]}
    assert sites == {100: [(f"site{i}", "api+rm+uvm", 4 * MiB) for i in range(3)],
                     200: [("site3", "api+rm+uvm", 8 * MiB)]}


def test_the_live_view_and_metrics(world: dict[str, Any]) -> None:
    agg: Aggregates = world["agg"]
    assert {p.pid: p.held_bytes for p in agg.snapshot().procs} == TRUTH
    held = {int(s.labels["pid"]): s.value for m in LiveCollector(agg.snapshot).collect()
            for s in m.samples if m.name == "gputrace_held_bytes"}
    assert held == TRUTH


def test_the_fleets_holders(world: dict[str, Any]) -> None:
    from gputrace.fleet.reports import merge, trace_partial

    procs = open_trace(world["path"]).scan("processes").collect()
    entry = {"trace_id": "t1", "host": "h", "status": "complete"}
    part = merge([trace_partial(entry, world["doc"], procs, False)], None)
    assert {h["pid"]: h["held_bytes"] for h in part["holders"]} == TRUTH
    assert part["held_bytes"] == sum(TRUTH.values())
