"""Every "who holds what" view gives a process ONE figure, the same in each, on a
recorded trace whose truth is one number per process: fixtures/standin-cuda (the
stand-in libcuda's cuda_workload: 23 x 1 MiB cuMemAlloc never freed, which the
stand-in driver sub-allocates from 12 x 2 MiB RM video-memory objects, each mapped
by UVM; the stand-in's own accounting of the process is those 24 MiB at the failing
allocation). The API (23 MiB), RM (24 MiB) and UVM (24 MiB) layers each see the same
memory; added, they made 71 MiB ("grew 71.0 MiB" in the demo).

Views: the oom report's holder figures and site tables, the live aggregates (view,
`gputrace_held_bytes`, the live_bytes alert) fed the trace's own tables, the
holders report, the leak report's `held_at_end`, `analyze --by pod|container` and the
fleet's holders (the trace's partial merged with an empty one)."""

from __future__ import annotations

import io
from typing import Any

import pytest

from gputrace.fleet.render import render_fleet_terminal
from gputrace.fleet.render_html import render_fleet_html
from gputrace.fleet.reports import EMPTY, merge, trace_partial
from gputrace.fleet.summarize import fleet_document
from gputrace.live.aggregates import Aggregates
from gputrace.trace.reader import open_trace
from tests.analyze_helpers import analyze
from tests.conftest import FIXTURES

STANDIN = FIXTURES / "standin-cuda"
MIB = 1 << 20
TRUTH = 24 * MIB  # 12 x 2 MiB RM objects: what the stand-in driver charges


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return analyze(STANDIN, ["oom", "holders"])


def test_oom_holder_one_figure(doc: dict[str, Any]) -> None:
    (inc,) = doc["oom"]["incidents"]
    (h,) = inc["holders"]
    assert (h["held_bytes"], h["grew_bytes"]) == (TRUTH, TRUTH)
    assert h["held_by_class"] == {"program": TRUTH}
    # the per-layer breakdown is still there, labelled per layer
    assert (h["api_bytes"], h["rm_bytes"], h["uvm_bytes"]) == (23 * MIB, TRUTH, TRUTH)
    for table in ("top_sites", "grew_sites"):
        (site,) = h[table]  # one row: the pieces, not once per layer
        assert (site["layer"], site["bytes"], site["count"]) == ("api+rm+uvm", TRUTH, 12)


def test_live_figure(doc: dict[str, Any]) -> None:
    t = open_trace(STANDIN)
    agg = Aggregates(clock=lambda: t.manifest["end_ts_ns"])
    for name in ("ioctls", "cuda_calls"):  # the recorded rows, in time order
        agg.observe(name, t.scan(name).sort("ts_ns").collect().to_arrow())
    (p,) = agg.snapshot().procs
    # the same process's memory at the end of the trace (the leaked 24 MiB)
    (end_h,) = [h for h in doc["oom"]["incidents"][0]["holders"]]
    assert p.pid == end_h["pid"] and p.held_bytes == TRUTH


@pytest.mark.parametrize("fixture", ["standin-cuda", "real-h200-cuda", "default"])
@pytest.mark.parametrize("share", [0.5, 1.0])
def test_live_figure_is_the_joined_models(fixture: str, share: float) -> None:
    """The live aggregates fed a recorded trace's rows up to an instant give each live
    process the figure the offline joined model gives it then. On the real H200 trace
    that is 618,659,840 bytes at the end, where its largest layer (RM, 700,444,672)
    counts 83,881,984 bytes of system memory and misses a 2 MiB managed range."""
    import polars as pl

    from gputrace.analyses.allocations.held import by_holder, held_pieces
    from gputrace.analyses.helpers.inputs import inputs_from_trace
    from gputrace.analyses.helpers.partition import per_slice

    t = open_trace(FIXTURES / fixture)
    start = t.scan("ioctls").select(pl.col("ts_ns").min()).collect().item()
    # up to just before the first process exit (an exited process holds nothing live)
    exits = t.scan("processes").select(pl.col("exit_ts_ns").min()).collect().item()
    stop = (t.manifest["end_ts_ns"] if exits is None else exits) - 1
    at = start + int((stop - start) * share)
    agg = Aggregates(clock=lambda: at)
    for name, ts in (("ioctls", "ts_ns"), ("cuda_calls", "ts_ns"), ("mappings", "ts_ns"),
                     ("processes", "exit_ts_ns")):
        rows = t.scan(name).filter(pl.col(ts).fill_null(0) <= at).sort(ts).collect()
        agg.observe(name, rows.to_arrow())
    live = {p.pid: p.held_bytes for p in agg.snapshot().procs}
    held = pl.concat(per_slice(inputs_from_trace(t), {"h": held_pieces})["h"])
    offline = {r["pid"]: r["held_bytes"] for r in by_holder(held, at).to_dicts()}
    assert live and live == {pid: offline[pid] for pid in live}
    if (fixture, share) == ("real-h200-cuda", 1.0):
        (p,) = agg.snapshot().procs
        assert p.held_bytes == 618_659_840 and p.live[("rm", 0)] == 700_444_672


def test_holders_report(doc: dict[str, Any]) -> None:
    inc = doc["holders"]["instants"][1]
    assert inc["at"] == "incident"
    (h,) = inc["holders"]
    assert (h["pid"], h["inherited"]) == (doc["oom"]["incidents"][0]["pid"], False)
    assert inc["orphaned_bytes"] == 0 and inc["cases"] == []


@pytest.mark.parametrize("by", ["pod", "container"])
def test_by_group_one_figure(by: str) -> None:
    leaks = analyze(STANDIN, ["leaks"], by=by)["leaks"]
    (row,) = leaks[f"by_{by}"]  # the one process is in no pod: the host's group
    assert (row["processes"], row["held_bytes"], row["program_bytes"]) == (1, TRUTH, TRUTH)
    # the layers are a breakdown beside it, each at most the figure, never added to it
    assert (row["api_layer_bytes"], row["rm_layer_bytes"], row["uvm_layer_bytes"]) == (
        23 * MIB, TRUTH, TRUTH)
    assert leaks["held_at_end"]["bytes"] == TRUTH


def test_fleet_one_figure() -> None:
    whole = analyze(STANDIN, ["leaks", "holders"])
    t = open_trace(STANDIN)
    entry = {"trace_id": "t1", "host": "h1", "date": "2026-01-01", "status": "complete",
             "driver_version": None, "gpu_model": None, "drops": {}}
    part = merge([trace_partial(entry, whole, t.scan("processes").collect(), False),
                  dict(EMPTY)], top=None)
    fleet = fleet_document(part, top=None, dataset="d", where=None,
                           engine={"workers": 1, "scheduler": "local"})
    (h,) = fleet["holders"]["top_processes"]
    assert fleet["holders"]["held_bytes"] == h["held_bytes"] == TRUTH
    assert (h["host"], h["comm"]) == ("h1", "cuda_workload")
    out = io.StringIO()
    render_fleet_terminal(fleet, out)
    assert "Top holders" in out.getvalue() and "24.0 MiB" in out.getvalue()
    assert "Top holders" in render_fleet_html(fleet)


@pytest.mark.parametrize("by", ["pod", "container"])
def test_summary_one_figure(by: str) -> None:
    """The summary's held memory (the joined model): every API allocation lies in an RM
    object, so the process's peak is the RM layer's (what the driver charged), not the
    layers added; it exited before the end, so it held nothing then. `--by` adds the
    one figure per group (one row, not one per layer)."""
    s = analyze(STANDIN, ["summary"], by=by)["summary"]
    (h,) = s["held"]
    layers = {r["layer"]: r["peak_bytes"] for r in s["processes"]}
    assert h["peak_bytes"] == layers["rm"] == max(layers.values())
    assert h["peak_bytes"] < sum(layers.values())
    assert h["live_end_bytes"] == 0
    (row,) = s[f"by_{by}"]
    assert (row["processes"], row["sum_of_peaks_bytes"], row["live_end_bytes"]) == (
        1, h["peak_bytes"], 0)
    assert "layer" not in row and row["rm_layer_live_end_bytes"] == 0
