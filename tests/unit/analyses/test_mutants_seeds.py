"""Tests that kill the mutants of the analyses that survived the mutation samples of
seeds 4711, 90210 and 1618 (docs/testing.md, "Mutation testing"): each asserts an independent
truth, a value planted in a small hand-made input (synthetic) or a figure counted by
hand beside it, and names in its docstring what it pins. Grouped by module; fast and
in-process.
"""

from __future__ import annotations

import dataclasses
import math
import pickle
import re
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from gputrace import docblocks
from gputrace.analyses import catalog, fail_on, registry
from gputrace.analyses.allocator.growth import growth
from gputrace.analyses.allocator.pool import pool
from gputrace.analyses.allocator.replay import entries, per_device
from gputrace.analyses.allocator.tensors import tensors
from gputrace.analyses.fault_rate import fault_rate
from gputrace.analyses.fault_rate.fault_batches import batches
from gputrace.analyses.fault_rate.oversubscription import oversubscription
from gputrace.analyses.fragmentation import fragmentation
from gputrace.analyses.fragmentation.free_space import snapshot
from gputrace.analyses.helpers.common import quantiles
from gputrace.analyses.helpers.gpus import gpu_memory
from gputrace.analyses.helpers.identity import with_identity
from gputrace.analyses.helpers.inputs import inputs_from_trace
from gputrace.analyses.holders import holders
from gputrace.analyses.leaks.growth import theil_sen, theil_sen_rows
from gputrace.analyses.oom.gpu_state import allocator_at, driver_round, gpu_at
from gputrace.analyses.report_spec import ReportOptions
from gputrace.analyses.run import not_recorded, run_reports
from gputrace.analyses.timeseries.active_memory import active_memory
from gputrace.analyses.timeseries.allocator_state import allocator_state
from gputrace.analyses.timeseries.memory_over_time import live_bytes
from gputrace.analyses.timeseries.rates_over_time import equal_cuts
from gputrace.importers.torch_snapshot import read_snapshot, write_alone
from gputrace.trace.builder import TraceBuilder, ns
from gputrace.trace.reader import open_trace
from tests.analyze_helpers import SCENARIO_DIR

DOCS = docblocks.ROOT / "docs"


# ------------------------------------------------------------------------- catalog
def _table(text: str) -> list[list[str]]:
    """The cells of a markdown table's rows (header and rule included)."""
    return [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in text.splitlines() if line.startswith("|")]


def test_reports_table_one_row_per_report_linking_its_page() -> None:
    """catalog.reports_table: a header, a rule, then one row per registered report in
    registry order with its `--only` name, JSON key, question, layers (or "none") and
    a link to its page, which exists; the committed docs/reports.md holds it."""
    text = catalog.reports_table()
    assert text.endswith("|\n") and not text.endswith("\n\n")
    head, rule, *rows = _table(text)
    assert head == ["report (`--only`)", "JSON key", "question", "trace layers read", "page"]
    assert rule == ["---"] * 5
    assert len(rows) == len(registry.REPORTS) > 5
    for row, spec in zip(rows, registry.REPORTS, strict=True):
        name, key, question, layers, page = row
        assert name == f"`{spec.name}`" and key == f"`{spec.key}`"
        assert question == spec.question.strip()
        want = [f"`{x}`" for x in spec.layers] or ["none"]
        assert layers.split(", ") == want
        link = re.fullmatch(r"\[(.+)\]\((analyses/.+\.md)\)", page)
        assert link is not None and link.group(1) == spec.name
        assert (DOCS / link.group(2)).is_file()
    assert text.rstrip("\n") in (DOCS / "reports.md").read_text()


def test_json_keys_table_a_key_per_report_then_the_documents_own() -> None:
    """catalog.json_keys_table: one row per report (its key, "object or null", its
    question and page), then `warnings` and `trace`; the committed
    docs/json-report.md holds it."""
    text = catalog.json_keys_table()
    assert text.endswith("|\n") and not text.endswith("\n\n")
    head, rule, *rows = _table(text)
    assert head == ["key", "type", "meaning"] and rule == ["---"] * 3
    assert len(rows) == len(registry.REPORTS) + 2
    for row, spec in zip(rows, registry.REPORTS, strict=False):
        assert row[:2] == [f"`{spec.key}`", "object or null"]
        assert row[2].startswith(spec.question)
        assert f"[analyses/{spec.name}.md](analyses/{spec.name}.md)" in row[2]
        assert row[2].endswith("`null` when `--only` left it out")
    assert [r[0] for r in rows[-2:]] == ["`warnings`", "`trace`"]
    assert rows[-2][1] == "list of strings" and rows[-1][1] == "object"
    assert "`duration_s`" in rows[-1][2] and "dropped" in rows[-2][2]
    assert text.rstrip("\n") in (DOCS / "json-report.md").read_text()


# ------------------------------------------------------------------------- fail_on
def test_fail_on_growth_hit_names_the_growing_pids() -> None:
    """fail_on.growth_hit: pids whose memory climbs fail the run, named; none do not."""
    assert fail_on.growth_hit({"growing_pids": [7, 9]}, 0.0) == (
        "growth: memory climbing in pid(s) [7, 9]")
    assert fail_on.growth_hit({"growing_pids": []}, 0.0) is None


def test_fail_on_oom_hit_counts_incidents_by_verdict() -> None:
    """fail_on.oom_hit: 3 incidents, 2 of one verdict and 1 of another, fail the run
    with each verdict's count in report order; no incident does not."""
    rep = {"count": 3, "by_verdict": [{"verdict": "fragmentation", "incidents": 2},
                                      {"verdict": "exhausted", "incidents": 1}]}
    assert fail_on.oom_hit(rep, 0.0) == (
        "oom: 3 out-of-memory incident(s) (2 fragmentation, 1 exhausted)")
    assert fail_on.oom_hit({"count": 0, "by_verdict": []}, 0.0) is None


# --------------------------------------------------- the PyTorch allocator reports
# A synthetic snapshot (plain dicts, never from PyTorch) of two devices and three pools
# of device 0. Its truth, by hand:
#   device 0, pool 0,0 large: SEG_A 20 MiB = an 8 MiB tensor (train, asked 8 MiB - 100)
#     + a 2 MiB tensor freed by the program, pending on another stream (evaluate)
#     + 10 MiB free;
#   device 0, pool 0,0 small: SEG_S 2 MiB = a 1 MiB tensor (train, asked 1 MiB - 1)
#     + 1 MiB free;
#   device 0, pool 1,2 (a private MemPool) large: SEG_P 64 MiB, one 64 MiB tensor (kv);
#   device 1, pool 0,0 large: SEG_D 40 MiB = a 30 MiB tensor (train) + 10 MiB free.
# Device 0 reserves 86 MiB, 73 MiB of it in tensors (8 + 1 + 64: the pending free is
# active, not allocated); device 1 reserves 40 MiB, 30 MiB allocated.
# History of device 0: SEG_A and its 8 MiB tensor at 1 s; SEG_B (2 MiB, past SEG_A's
# end, in no pool at the end) allocated at 2 s and freed at 3 s.
MiB = 1 << 20
T_US = 1_767_225_600_000_000
SEG_A, SEG_B = 0x7F00_0000_0000, 0x7F00_0400_0000
# SEG_S lies below SEG_A and is listed first: the pools' large/small order is the report's
SEG_S, SEG_P, SEG_D = 0x7E00_0000_0000, 0x7F00_2000_0000, 0x7F80_0000_0000
F_TRAIN = [{"name": "train", "filename": "/home/u/t.py", "line": 10}]
F_EVAL = [{"name": "evaluate", "filename": "/home/u/t.py", "line": 20}]
F_KV = [{"name": "kv_cache", "filename": "/home/u/serve.py", "line": 5}]


def _block(addr: int, size: int, state: str, req: int | None = None,
           frames: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"address": addr, "size": size, "requested_size": size if req is None else req,
            "state": state, "frames": frames or []}


def _segment(device: int, addr: int, blocks: list[dict[str, Any]], pool: str = "large",
             pool_id: tuple[int, int] = (0, 0)) -> dict[str, Any]:
    alloc = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    active = sum(b["size"] for b in blocks if b["state"] != "inactive")
    return {"device": device, "address": addr, "total_size": sum(b["size"] for b in blocks),
            "allocated_size": alloc, "active_size": active, "requested_size": alloc,
            "stream": 0, "segment_type": pool, "segment_pool_id": pool_id,
            "is_expandable": False, "frames": [], "blocks": blocks}


def _entry(action: str, t_s: float, size: int, addr: int,
           frames: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"action": action, "size": size, "stream": 0, "addr": addr,
            "time_us": T_US + round(t_s * 1e6), "frames": frames or []}


def _pools_snapshot() -> dict[str, Any]:
    return {
        "segments": [
            _segment(0, SEG_S, [
                _block(SEG_S, 1 * MiB, "active_allocated", 1 * MiB - 1, F_TRAIN),
                _block(SEG_S + 1 * MiB, 1 * MiB, "inactive", 0)], pool="small"),
            _segment(0, SEG_A, [
                _block(SEG_A, 8 * MiB, "active_allocated", 8 * MiB - 100, F_TRAIN),
                _block(SEG_A + 8 * MiB, 2 * MiB, "active_pending_free", None, F_EVAL),
                _block(SEG_A + 10 * MiB, 10 * MiB, "inactive", 0)]),
            _segment(0, SEG_P, [_block(SEG_P, 64 * MiB, "active_allocated", None, F_KV)],
                     pool_id=(1, 2)),
            _segment(1, SEG_D, [
                _block(SEG_D, 30 * MiB, "active_allocated", None, F_TRAIN),
                _block(SEG_D + 30 * MiB, 10 * MiB, "inactive", 0)]),
        ],
        "device_traces": [[
            _entry("segment_alloc", 1.0, 20 * MiB, SEG_A, F_TRAIN),
            _entry("alloc", 1.0, 8 * MiB, SEG_A, F_TRAIN),
            _entry("segment_alloc", 2.0, 2 * MiB, SEG_B),
            _entry("segment_free", 3.0, 2 * MiB, SEG_B),
        ], []],
        "allocator_settings": {}, "external_annotations": [],
    }


def _snapshot_trace(tmp: Path, snap: dict[str, Any]) -> Path:
    f = tmp / "s.pickle"
    f.write_bytes(pickle.dumps(snap))
    return write_alone(read_snapshot(f), tmp / "t")


@pytest.fixture(scope="module")
def pools_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _snapshot_trace(tmp_path_factory.mktemp("pools"), _pools_snapshot())


def test_pool_headline_is_the_device_reserving_most(pools_trace: Path) -> None:
    """allocator/pool.py: the headline is device 0 (86 MiB reserved, before device 1's
    40 MiB), its allocated bytes are its tensors' (73 MiB), and two devices are said."""
    p = pool(inputs_from_trace(open_trace(pools_trace)))
    d = p.data
    assert [r["device"] for r in d["devices"]] == [0, 1]
    assert [r["reserved_bytes"] for r in d["devices"]] == [86 * MiB, 40 * MiB]
    assert (d["device"], d["reserved_bytes"], d["allocated_bytes"], d["active_bytes"]) == (
        0, 86 * MiB, 73 * MiB, 75 * MiB)
    assert d["segment_count"] == 3
    assert [w for w in p.warnings if "devices" in w] == [
        "allocator-pool: 2 devices; the headline is device 0's (most reserved), "
        "`devices` lists each"]


def test_pool_rows_by_device_pool_id_then_large_before_small(pools_trace: Path) -> None:
    """allocator/pool.py: one row per device and pool, in device, pool id and
    large/small order; a private pool is its own row."""
    d = pool(inputs_from_trace(open_trace(pools_trace))).data
    assert [(r["device"], r["pool_id"], r["pool"], r["reserved_bytes"]) for r in d["pools"]] == [
        (0, "0,0", "large", 20 * MiB), (0, "0,0", "small", 2 * MiB),
        (0, "1,2", "large", 64 * MiB), (1, "0,0", "large", 40 * MiB)]


def test_pool_one_device_is_no_warning(tmp_path: Path) -> None:
    """allocator/pool.py: a snapshot of one device says nothing about devices."""
    snap = _pools_snapshot()
    snap["segments"] = snap["segments"][1:2]
    snap["device_traces"] = snap["device_traces"][:1]
    p = pool(inputs_from_trace(open_trace(_snapshot_trace(tmp_path, snap))))
    assert p.data["reserved_bytes"] == 20 * MiB and p.data["allocated_bytes"] == 8 * MiB
    assert not [w for w in p.warnings if "devices" in w]


def test_tensors_pending_free_counted_per_stack(pools_trace: Path) -> None:
    """allocator/tensors.py: per device and stack, largest first; the 2 MiB tensor
    freed by evaluate() but pending on another stream is its stack's one pending free,
    train's are not pending."""
    t = tensors(inputs_from_trace(open_trace(pools_trace))).data
    by = [(s["device"], s["top_frame"], s["count"], s["bytes"], s["pending_free"])
          for s in t["by_stack"]]
    assert by == [(0, "kv_cache (serve.py:5)", 1, 64 * MiB, 0),
                  (1, "train (t.py:10)", 1, 30 * MiB, 0), (0, "train (t.py:10)", 2, 9 * MiB, 0),
                  (0, "evaluate (t.py:20)", 1, 2 * MiB, 1)]
    assert (t["pending_free_count"], t["pending_free_bytes"]) == (1, 2 * MiB)


def test_replay_entries_past_a_segment_end_have_no_pool(pools_trace: Path) -> None:
    """allocator/replay.entries: SEG_B lies past SEG_A's end and is gone at the end, so
    its entries are in no snapshot segment and no pool; SEG_A's are in pool 0,0 large.
    The cache's free bytes are reserved minus active after each entry."""
    ev = entries(inputs_from_trace(open_trace(pools_trace))).collect().sort("i")
    got = ev.select("action", "address", "pool_id", "pool", "in_snapshot_segment",
                    "reserved_bytes", "active_bytes", "cache_free_bytes").rows()
    # device 0 ends at 86 MiB reserved, 75 MiB active: backwards from there
    assert got == [
        ("segment_alloc", SEG_A, "0,0", "large", True, 86 * MiB, 67 * MiB, 19 * MiB),
        ("alloc", SEG_A, "0,0", "large", True, 86 * MiB, 75 * MiB, 11 * MiB),
        ("segment_alloc", SEG_B, None, None, False, 88 * MiB, 75 * MiB, 13 * MiB),
        ("segment_free", SEG_B, None, None, False, 86 * MiB, 75 * MiB, 11 * MiB)]


def test_per_device_end_is_the_last_entry(pools_trace: Path) -> None:
    """allocator/replay.per_device: device 0's four entries start at 66 MiB reserved
    (86 - 20 + 2 - 2) and end at 86; the peak is 88 MiB, SEG_B's moment."""
    ev = entries(inputs_from_trace(open_trace(pools_trace))).collect()
    (d0,) = per_device(ev)
    assert (d0["device"], d0["entries"]) == (0, 4)
    assert (d0["start_reserved_bytes"], d0["end_reserved_bytes"], d0["peak_reserved_bytes"]) == (
        66 * MiB, 86 * MiB, 88 * MiB)
    assert (d0["start_active_bytes"], d0["end_active_bytes"]) == (67 * MiB, 75 * MiB)


def test_stack_frames_innermost_first_whatever_the_row_order(tmp_path: Path) -> None:
    """allocator/frames.stack_labels: a stack's frames read innermost first (depth 0
    first) even when the table holds them outermost first."""
    b = TraceBuilder(("allocator",), duration_s=1.0)
    b.process(7, "python")
    for depth, (fn, line) in reversed(list(enumerate([("inner", 3), ("mid", 2),
                                                      ("outer", 1)]))):
        b.row("allocator_frames", stack_id=1, depth=depth, function=fn, filename="/u/m.py",
              line=line)
    b.row("allocator_segments", pid=7, device=0, address=SEG_A, total_size_bytes=2 * MiB,
          allocated_size_bytes=2 * MiB, active_size_bytes=2 * MiB, pool="small",
          pool_id="0,0", is_expandable=False)
    b.row("allocator_blocks", pid=7, device=0, segment_address=SEG_A, address=SEG_A,
          size_bytes=2 * MiB, requested_size_bytes=2 * MiB, state_code=1,
          state="active_allocated", stack_id=1)
    t = tensors(inputs_from_trace(open_trace(b.build(tmp_path / "t")))).data
    (s,) = t["by_stack"]
    assert s["frames"] == ["inner (/u/m.py:3)", "mid (/u/m.py:2)", "outer (/u/m.py:1)"]
    assert s["top_frame"] == "inner (m.py:3)"


def test_pool_report_tables_of_the_pools_snapshot(pools_trace: Path) -> None:
    """allocator/pool.py: device 0's reserved-but-unallocated bytes are 86 - 73 MiB;
    its largest free block is SEG_A's 10 MiB of 11 MiB free (10 + 1)."""
    d = pool(inputs_from_trace(open_trace(pools_trace))).data
    assert d["reserved_unallocated_bytes"] == 13 * MiB
    assert d["largest_inactive_bytes"] == 10 * MiB
    assert abs(d["fragmentation"] - (1 - 10 / 11)) < 1e-12


def _empty_snapshot(tmp: Path) -> Path:
    """A snapshot of one empty segment-less device: no blocks, no history."""
    return _snapshot_trace(tmp, {"segments": [], "device_traces": [[]],
                                 "allocator_settings": {}, "external_annotations": []})


def test_allocator_reports_of_an_empty_snapshot(tmp_path: Path) -> None:
    """allocator pool, tensors and growth on a snapshot that holds nothing: recorded,
    every figure zero or null, each saying why in one warning."""
    inp = inputs_from_trace(open_trace(_empty_snapshot(tmp_path)))
    p = pool(inp)
    assert p.recorded and (p.data["device"], p.data["reserved_bytes"]) == (None, 0)
    assert (p.data["devices"], p.data["pools"], p.data["segments"]) == ([], [], [])
    t = tensors(inp)
    assert t.recorded is True and t.missing_layers == []
    assert (t.data["total_count"], t.data["total_bytes"], t.data["by_stack"]) == (0, 0, [])
    assert "tensors: the snapshot holds no active blocks" in t.warnings
    g = growth(inp)
    assert g.recorded is True and g.missing_layers == []
    assert (g.data["entries"], g.data["device"], g.data["series"]) == (0, None, [])
    assert [w for w in g.warnings if w.startswith("allocator-growth:")] == [
        "allocator-growth: the snapshot holds no trace entries (history not recorded: "
        "torch.cuda.memory._record_memory_history() before the run)"]


def _long_history() -> dict[str, Any]:
    """One expandable 1 GiB segment and 1002 entries: its map (entry 0); 500
    allocations of 1 MiB by train(), k MiB into it (1..500); 498 of them freed
    (501..998); a second 2 MiB map and its unmap (999, 1000); a 2 MiB allocation by
    evaluate() (1001). Alive at the end: train's last two and evaluate's, 4 MiB."""
    seg, e = SEG_A, []
    e.append(_entry("segment_map", 0.0, 1024 * MiB, seg))
    e += [_entry("alloc", 0.001 * k, 1 * MiB, seg + k * MiB, F_TRAIN) for k in range(500)]
    e += [_entry("free_completed", 1.0 + 0.001 * k, 1 * MiB, seg + k * MiB, F_TRAIN)
          for k in range(498)]
    e.append(_entry("segment_map", 2.0, 2 * MiB, seg + 1024 * MiB))
    e.append(_entry("segment_unmap", 2.1, 2 * MiB, seg + 1024 * MiB))
    e.append(_entry("alloc", 2.2, 2 * MiB, seg + 500 * MiB, F_EVAL))
    blocks = [_block(seg, 498 * MiB, "inactive", 0),
              _block(seg + 498 * MiB, 1 * MiB, "active_allocated", None, F_TRAIN),
              _block(seg + 499 * MiB, 1 * MiB, "active_allocated", None, F_TRAIN),
              _block(seg + 500 * MiB, 2 * MiB, "active_allocated", None, F_EVAL),
              _block(seg + 502 * MiB, 522 * MiB, "inactive", 0)]
    s = _segment(0, seg, blocks)
    s["is_expandable"] = True
    return {"segments": [s], "device_traces": [e], "allocator_settings": {},
            "external_annotations": []}


def test_growth_long_history_thinned_keeping_peak_and_end(tmp_path: Path) -> None:
    """allocator/growth.py on 1002 entries: the series keeps every 3rd entry (ceil(1002
    / 400)), plus the peak (entry 500, 500 MiB active) and the last one (1001, 4 MiB);
    by stack, train retains 2 of 500 (2 MiB) and comes before evaluate (1 of 1, 2 MiB,
    fewer allocs); the expandable segment was mapped twice and unmapped once."""
    g = growth(inputs_from_trace(open_trace(_snapshot_trace(tmp_path, _long_history())))).data
    assert g["entries"] == 1002
    kept = [p["entry"] for p in g["series"]]
    assert kept == sorted({*range(0, 1002, 3), 500, 1001})
    at = {p["entry"]: p["active_bytes"] for p in g["series"]}
    assert (at[500], at[1001], at[0]) == (500 * MiB, 4 * MiB, 0)
    assert (g["peak_active_bytes"], g["end_active_bytes"], g["start_active_bytes"]) == (
        500 * MiB, 4 * MiB, 0)
    assert [(s["top_frame"], s["allocs"], s["retained_count"], s["retained_bytes"])
            for s in g["by_stack"]] == [("train (t.py:10)", 500, 2, 2 * MiB),
                                        ("evaluate (t.py:20)", 1, 1, 2 * MiB)]
    (d,) = g["devices"]
    assert (d["segment_maps"], d["segment_unmaps"]) == (2, 1)
    assert (d["start_reserved_bytes"], d["end_reserved_bytes"], d["peak_reserved_bytes"]) == (
        0, 1024 * MiB, 1026 * MiB)


def test_growth_by_stack_largest_retained_first(tmp_path: Path) -> None:
    """allocator/growth.retained_by_stack: evaluate() retains 6 MiB in one alloc, train
    1 MiB of 3: evaluate first, whatever the allocs."""
    seg = SEG_A
    e = [_entry("segment_alloc", 0.0, 20 * MiB, seg),
         *[_entry("alloc", 0.1 * k, 1 * MiB, seg + k * MiB, F_TRAIN) for k in (1, 2, 3)],
         *[_entry("free_completed", 1 + 0.1 * k, 1 * MiB, seg + k * MiB, F_TRAIN)
           for k in (1, 2)],
         _entry("alloc", 2.0, 6 * MiB, seg + 8 * MiB, F_EVAL)]
    blocks = [_block(seg, 3 * MiB, "inactive", 0),
              _block(seg + 3 * MiB, 1 * MiB, "active_allocated", None, F_TRAIN),
              _block(seg + 4 * MiB, 4 * MiB, "inactive", 0),
              _block(seg + 8 * MiB, 6 * MiB, "active_allocated", None, F_EVAL),
              _block(seg + 14 * MiB, 6 * MiB, "inactive", 0)]
    snap = {"segments": [_segment(0, seg, blocks)], "device_traces": [e],
            "allocator_settings": {}, "external_annotations": []}
    g = growth(inputs_from_trace(open_trace(_snapshot_trace(tmp_path, snap)))).data
    assert [(s["top_frame"], s["allocs"], s["retained_bytes"]) for s in g["by_stack"]] == [
        ("evaluate (t.py:20)", 1, 6 * MiB), ("train (t.py:10)", 3, 1 * MiB)]
    assert g["by_stack"][1]["retained_bytes_per_alloc"] == MiB / 3


def test_fail_on_fragmentation_without_any_gpu() -> None:
    """fail_on.fragmentation_hit: a report with no GPU figures at all (neither PMM nor
    RM samples) is index 0: it passes any threshold, it does not fail or crash."""
    assert fail_on.fragmentation_hit({"gpus": [], "rm": None}, 0.0) is None
    assert fail_on.fragmentation_hit({"gpus": None}, 0.5) is None
    rep = {"gpus": [{"peak": {"fragmentation_index": 0.4}, "end": None}],
           "rm": {"gpus": [{"worst": {"unusable_share": 0.7}}]}}
    assert fail_on.fragmentation_hit(rep, 0.5) == "fragmentation: index 0.700 > 0.5"
    assert fail_on.fragmentation_hit(rep, 0.7) is None


# ------------------------------------------------------------------------ registry
@pytest.mark.parametrize("scenario", ["fragmented_gpu", "uvm_storm", "fault_rates",
                                      "oom_capacity_fragmentation"])
def test_every_recorded_report_names_itself_as_registered(scenario: str) -> None:
    """report.Report.name: each report a trace's layers allow is recorded and carries
    its registry name (the name renderers and `--only` use), whatever module made it."""
    inp = inputs_from_trace(open_trace(SCENARIO_DIR / scenario))
    ctx = registry.Context(inp, ReportOptions(), registry.names())
    ran = 0
    for spec in registry.REPORTS:
        if registry.unrecorded(spec, inp, []) is not None:
            continue
        rep = spec.run(ctx)
        assert (rep.name, rep.recorded) == (spec.name, True)
        ran += 1
    assert ran >= 3


def test_allocator_reports_name_themselves_as_registered(pools_trace: Path) -> None:
    """report.Report.name for the allocator layer's reports on the pools snapshot."""
    inp = inputs_from_trace(open_trace(pools_trace))
    ctx = registry.Context(inp, ReportOptions(), registry.names())
    names = [s.name for s in registry.REPORTS if registry.unrecorded(s, inp, []) is None
             and (rep := s.run(ctx)).name == s.name and rep.recorded]
    assert {"tensors", "allocator-growth", "allocator-pool"} <= set(names)


# ------------------------------------------------------------------ leaks/growth
def test_theil_sen_of_a_bent_series_by_hand() -> None:
    """leaks/growth.theil_sen on (0,0) (1,1) (2,2) (3,4): pairwise slopes 1, 1, 1, 4/3,
    3/2, 2 give the median 7/6; intercept median(y - 7/6 x) = -1/12; residuals 1/12,
    -1/12, -1/4, 7/12 give r2 = 1 - (5/12) / (35/4) = 20/21 and MAD 1/6. Rows at once
    (theil_sen_rows) give the same numbers."""
    x, y = np.array([0.0, 1, 2, 3]), np.array([0.0, 1, 2, 4])
    want = (7 / 6, -1 / 12, 20 / 21, 1 / 6)
    assert theil_sen(x, y) == pytest.approx(want)
    assert theil_sen_rows(x[None, :], y[None, :]) == [pytest.approx(want)]
    assert theil_sen(x, 3 * x + 2) == pytest.approx((3.0, 2.0, 1.0, 0.0))


# ------------------------------------------------------------ fragmentation/free_space
def _space(iv: list[tuple[int, int, int, int | None]], hi: int, t: int) -> dict[str, Any]:
    frame = pl.LazyFrame(iv, schema={"start": pl.Int64, "end": pl.Int64,
                                     "alloc_ts_ns": pl.Int64, "free_ts_ns": pl.Int64},
                         orient="row").with_columns(space=pl.lit(0, pl.Int64))
    spaces = pl.DataFrame({"space": [0], "lo": [0], "hi": [hi]})
    (row,) = snapshot(frame, spaces, pl.DataFrame({"space": [0], "t": [t]})).collect().to_dicts()
    return row


def test_free_space_measures_by_hand() -> None:
    """fragmentation/free_space.snapshot of 8 MiB (4 root chunks) at t = 5 holding
    [0, 1 MiB), [2, 4 MiB) (a whole root) and [5, 5.5 MiB); one interval freed at 4 and
    one made at 6 do not count. Used 3.5 MiB, free 4.5 MiB, the largest free run the
    last 2.5 MiB; 3 roots used, 2 of them partly: 1 root (2 MiB) is usable by a 2 MiB
    chunk, so 2.5 MiB are unusable; index 1 - 2.5 / 4.5 = 4/9."""
    r = _space([(0, MiB, 1, None), (2 * MiB, 4 * MiB, 2, None), (5 * MiB, 5 * MiB + MiB // 2, 3, 9),
                (6 * MiB, 7 * MiB, 1, 4), (7 * MiB, 8 * MiB, 6, None)], 8 * MiB, 5)
    assert (r["ts_ns"], r["used_bytes"], r["free_bytes"]) == (5, 7 * MiB // 2, 9 * MiB // 2)
    assert r["largest_free_run_bytes"] == 5 * MiB // 2
    assert r["unusable_2m_bytes"] == 5 * MiB // 2
    assert r["partial_root_share"] == pytest.approx(2 / 3)
    assert r["fragmentation_index"] == pytest.approx(4 / 9)


def test_free_space_of_a_full_space_has_no_index() -> None:
    """fragmentation/free_space.snapshot: a space used whole has no free bytes, so no
    fragmentation index (null, not 0/0), and nothing unusable."""
    r = _space([(0, 2 * MiB, 1, None)], 2 * MiB, 5)
    assert (r["free_bytes"], r["unusable_2m_bytes"], r["largest_free_run_bytes"]) == (0, 0, 0)
    assert r["fragmentation_index"] is None and r["partial_root_share"] == 0.0


# -------------------------------------------------------- fragmentation/pmm_chunks
def test_pmm_chunks_evicted_root_and_size_histogram(tmp_path: Path) -> None:
    """fragmentation from PMM chunks on an 8 MiB GPU: at t = 1 a 2 MiB chunk at 0, a
    64 KiB one at 2 MiB and a 4 KiB one at 4 MiB; the 64 KiB one freed at 2; root 0
    evicted at 3 (its chunk ends without a free). At the end only the 4 KiB chunk is
    used: 4 KiB used, root 2 partly used, 6 MiB usable by 2 MiB chunks, so 2 MiB - 4
    KiB unusable. At the peak (t = 1): 3 roots used, 2 partly. One alloc per size."""
    KiB = 1024
    b = TraceBuilder(("syscall", "driver"), duration_s=10.0, gpu_memory_bytes=8 * MiB)
    b.chunk(1.0, 0, "alloc", 0, 21)
    b.chunk(1.0, 0, "alloc", 2 * MiB, 16)
    b.chunk(1.0, 0, "alloc", 4 * MiB, 12)
    b.chunk(2.0, 0, "free", 2 * MiB, 16)
    b.chunk(3.0, 0, "evict", 0, 21)
    rep = fragmentation(inputs_from_trace(open_trace(b.build(tmp_path / "t"))))
    (g,) = rep.data["gpus"]
    assert g["histogram"] == {"4KiB": 1, "64KiB": 1, "2MiB": 1, "other": 0}
    end, peak = g["end"], g["peak"]
    assert (end["used_bytes"], end["free_bytes"]) == (4 * KiB, 8 * MiB - 4 * KiB)
    assert end["unusable_2m_bytes"] == 2 * MiB - 4 * KiB
    assert end["largest_free_run_bytes"] == 4 * MiB
    assert peak["used_bytes"] == 2 * MiB + 68 * KiB
    assert peak["partial_root_share"] == pytest.approx(2 / 3)
    assert peak["unusable_2m_bytes"] == 4 * MiB - 68 * KiB


# ------------------------------------------------------------------- helpers/gpus
def test_gpu_memory_replayed_in_time_order_whatever_the_row_order() -> None:
    """helpers/gpus.gpu_memory: rows stored out of time order (a free at 3 before the
    allocations at 1 and 2) replay in time order: 2 MiB, 4 MiB, 2 MiB: peak 4 MiB."""
    chunks = pl.LazyFrame({"gpu_index": [0, 0, 0], "ts_ns": [3, 1, 2],
                           "chunk_op": ["free", "alloc", "alloc"],
                           "log2_size": [21, 21, 21]})
    assert gpu_memory(chunks).collect().rows() == [(0, 4 * MiB, 2 * MiB)]


# ------------------------------------------------------------------ oom/gpu_state
def test_gpu_at_takes_the_incident_sample_after_the_failure() -> None:
    """oom/gpu_state.gpu_at: failure at 900 ns; an incident sample at 1000 (100 ns
    after) wins over a nearer periodic one at 880; its distance is +100."""
    s = pl.DataFrame({"ts_ns": [880, 1000], "gpu_index": [0, 0], "heap_size_bytes": [80, 80],
                      "heap_free_bytes": [5, 3], "largest_free_bytes": [4, 2],
                      "trigger": ["tick", "incident"], "delay_ns": [None, 7]})
    got = gpu_at(s, 0, 900)
    assert got == {"total_bytes": 80, "free_bytes": 3, "largest_free_bytes": 2,
                   "sample_ts_ns": 1000, "sample_trigger": "incident",
                   "sample_distance_ns": 100, "sample_delay_ns": 7}
    assert gpu_at(s, 0, 10_000_000_000)["sample_distance_ns"] == 1000 - 10_000_000_000
    assert gpu_at(s, 1, 900) is None


def test_driver_round_nearest_the_failure_every_pid(tmp_path: Path) -> None:
    """oom/gpu_state.driver_round: a round at 1.0 s (pid 10: 1 GiB, pid 11 10 ms later:
    2 GiB) and one at 5 s (pid 10: 3 GiB); a failure at 1.2 s reads the first round,
    both pids, 0.2 s before it."""
    GiB = 1 << 30
    b = TraceBuilder(("syscall", "rm_query"), duration_s=6.0)
    b.gpu_process_memory(1.0, 0, 10, 1 * GiB)
    b.gpu_process_memory(1.01, 0, 11, 2 * GiB)
    b.gpu_process_memory(5.0, 0, 10, 3 * GiB)
    inp = inputs_from_trace(open_trace(b.build(tmp_path / "t")))
    when, by_pid = driver_round(inp, 0, ns(1.2))
    assert by_pid == {10: 1 * GiB, 11: 2 * GiB}
    assert when == {"ts_ns": ns(1.0), "trigger": "tick", "distance_ns": ns(1.0) - ns(1.2)}
    assert driver_round(inp, 0, ns(4.9))[1] == {10: 3 * GiB}


def test_allocator_at_rolls_back_to_the_instant(pools_trace: Path) -> None:
    """oom/gpu_state.allocator_at on the pools snapshot, device 0: at 2.5 s SEG_B (2 MiB)
    is still reserved: 88 MiB reserved, 75 MiB active; at the end 86 and 75; before
    any entry 66 and 67 (the replay's start)."""
    inp = inputs_from_trace(open_trace(pools_trace))
    at = {k: allocator_at(inp, 0, (T_US + round(s * 1e6)) * 1000) for k, s in (
        ("mid", 2.5), ("end", 9.0), ("before", 0.5))}
    assert [list(v.values()) for v in at.values()] == [  # type: ignore[union-attr]
        [(88 * MiB, 75 * MiB)], [(86 * MiB, 75 * MiB)], [(66 * MiB, 67 * MiB)]]


# --------------------------------------------------------------- registry and run
def test_fault_rate_window_comes_from_the_options() -> None:
    """registry: `analyze --window` reaches the fault-rate report: windows of 0.25 s
    over the same trace are 4 times as many as of 1 s."""
    inp = inputs_from_trace(open_trace(SCENARIO_DIR / "fault_rates"))
    docs = {w: run_reports(inp, ["fault-rate"], ReportOptions(window_s=w))["fault_rate"]
            for w in (1.0, 0.25)}
    assert (docs[1.0]["window_s"], docs[0.25]["window_s"]) == (1.0, 0.25)
    assert docs[1.0]["thrashing"]["window_s"] == 1.0
    span = docs[1.0]["windows"]["span_s"]
    assert docs[1.0]["windows"]["count"] == math.ceil(span)
    assert docs[0.25]["windows"]["count"] == math.ceil(span / 0.25)


def test_not_recorded_names_the_lacking_layers_only() -> None:
    """run.not_recorded: of the layers a gate needs, those the trace lacks, in the
    order asked; none lacking is None; a report not recorded names its own."""
    doc = {"leaks": {"recorded": True}, "trace": {"layers": ["syscall", "api"]},
           "fault_rate": {"recorded": False, "not_recorded_layers": ["driver", "uvm_tools"]}}
    assert not_recorded(doc, "leaks", ("api", "driver", "rm_query")) == "driver, rm_query"
    assert not_recorded(doc, "leaks", ("api", "syscall")) is None
    assert not_recorded(doc, "leaks") is None
    assert not_recorded(doc, "fault-rate", ("api",)) == "driver, uvm_tools"


# ------------------------------------------------------------------------------ oom
def test_nested_failures_carry_their_own_times(tmp_path: Path) -> None:
    """oom: the two RM_ALLOC failures inside one failed cuMemAlloc (at 1.0011 s and
    1.0032 s) are its evidence, each at its own time."""
    GiB = 1 << 30
    b = TraceBuilder(layers=("syscall", "api", "rm_query"), duration_s=2.0,
                     gpu_memory_bytes=GiB)
    b.process(7, "job")
    b.gpu_memory(0.5, 0, heap=GiB, free=900 * MiB, largest=800 * MiB, trigger="tick")
    b.row("cuda_calls", ts_ns=ns(1.0), pid=7, func="cuMemAlloc_v2", size_bytes=64 * MiB,
          ptr=0, result=2, latency_ns=5_000_000)
    for dt in (0.0011, 0.0032):
        b.rm_alloc(1.0 + dt, 7, size=64 * MiB, status=0x51)
    doc = run_reports(inputs_from_trace(open_trace(b.build(tmp_path / "t"))), ["oom"])
    (one,) = doc["oom"]["incidents"]
    assert [(n["layer"], n["call"], n["status"], n["ts_ns"]) for n in one["nested"]] == [
        ("rm", "RM_ALLOC", 0x51, ns(1.0011)), ("rm", "RM_ALLOC", 0x51, ns(1.0032))]


# ------------------------------------------------- allocator state at an OOM instant
def test_oom_map_joins_expandable_pieces_and_marks_released_segments(tmp_path: Path) -> None:
    """timeseries/allocator_state maps at an OOM (allocator/oom_state.CacheMemory): an
    expandable segment mapped 4 MiB at 1.0 s, whose upper 2 MiB are unmapped at 2.1 s
    (after the OOM at 1.5 s), is one 4 MiB run at the OOM (the rolled-back unmap is a
    piece of its own, joined to the one below it): its 1 MiB tensor first, then 3 MiB
    free. SEG_B (2 MiB, from 1.3 s, released at 2.0 s: not in the snapshot) is still
    reserved then, pool `?`. At the end only 2 MiB of the expandable segment are left."""
    seg_a, seg_b = SEG_A, SEG_A + 64 * MiB
    s = _segment(0, seg_a, [_block(seg_a, 1 * MiB, "active_allocated", None, F_TRAIN),
                            _block(seg_a + 1 * MiB, 1 * MiB, "inactive", 0)])
    s["is_expandable"] = True
    oom = _entry("oom", 1.5, 1 << 30, 0, F_EVAL)
    del oom["addr"]
    oom["device_free"] = 0
    snap = {"segments": [s], "device_traces": [[
        _entry("segment_map", 1.0, 4 * MiB, seg_a), _entry("alloc", 1.1, 1 * MiB, seg_a, F_TRAIN),
        _entry("segment_alloc", 1.3, 2 * MiB, seg_b), oom,
        _entry("segment_free", 2.0, 2 * MiB, seg_b),
        _entry("segment_unmap", 2.1, 2 * MiB, seg_a + 2 * MiB)]],
        "allocator_settings": {"expandable_segments": True}, "external_annotations": []}
    a = allocator_state(inputs_from_trace(open_trace(_snapshot_trace(tmp_path, snap))))
    end, at_oom = a["maps"]
    assert at_oom["requested_bytes"] == 1 << 30
    assert [(x["address"], x["total_bytes"], x["pool"], x["pool_id"])
            for x in at_oom["segments"]] == [(seg_a, 4 * MiB, "large", "0,0"),
                                             (seg_b, 2 * MiB, "?", None)]
    assert at_oom["segments"][0]["pieces"] == [
        {"offset": 0, "bytes": 1 * MiB, "kind": "allocated"},
        {"offset": 1 * MiB, "bytes": 3 * MiB, "kind": "free"}]
    assert [(x["address"], x["total_bytes"]) for x in end["segments"]] == [(seg_a, 2 * MiB)]


def test_allocator_at_a_device_without_history_is_its_end_state(pools_trace: Path) -> None:
    """oom/gpu_state.allocator_at (allocator/replay.state_by_pid) on device 1 of the
    pools snapshot, which has no trace entries: the snapshot's own 40 MiB reserved and
    30 MiB active, whatever the instant."""
    inp = inputs_from_trace(open_trace(pools_trace))
    got = allocator_at(inp, 1, 0)
    assert got is not None and list(got.values()) == [(40 * MiB, 30 * MiB)]


def test_reports_table_says_none_for_a_report_reading_no_layer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """catalog.reports_table: a report that reads no trace layer says `none`."""
    toy = dataclasses.replace(registry.REPORTS[0], name="toy", key="toy", layers=())
    monkeypatch.setattr(registry, "REPORTS", [*registry.REPORTS, toy])
    last = _table(catalog.reports_table())[-1]
    assert last[:2] == ["`toy`", "`toy`"] and last[3] == "none"


# -------------------------------------------------------------- helpers/identity
def test_a_reused_pid_is_named_by_its_instance_that_has_an_identity(tmp_path: Path) -> None:
    """helpers/identity.process_identity: pid 40 ran in pod `train` (from 0 s) and was
    reused by a host process (from 5 s, no identity): without a time, the pid's
    identity is the pod's, not the later instance's nulls; with a time, each row gets
    the instance running then."""
    b = TraceBuilder(("syscall",), duration_s=10.0)
    b.process(40, "python", start=0.0, exit=4.0, pod_namespace="ml", pod_name="train",
              pod_uid="u-1", container_name="main", container_id="c1")
    b.process(40, "bash", start=5.0)
    inp = inputs_from_trace(open_trace(b.build(tmp_path / "t")))
    rows = pl.LazyFrame({"pid": [40, 40], "ts_ns": [ns(1.0), ns(6.0)]},
                        schema={"pid": pl.Int32, "ts_ns": pl.Int64})
    plain = with_identity(rows, inp.scan("processes")).collect()
    assert plain["pod_name"].to_list() == ["train", "train"]
    timed = with_identity(rows, inp.scan("processes"), at="ts_ns").collect()
    assert timed["pod_name"].to_list() == ["train", None]
    assert timed["container_id"].to_list() == ["c1", None]


def test_oom_holders_sites_say_what_holds_the_bytes() -> None:
    """oom/holders: at the capacity failure of scenario oom_capacity_fragmentation
    (40 s), `train` holds 384 MiB from load_model (one cuMemAlloc) and 4 x 32 MiB from
    grow_cache; `serve` 256 MiB of RM vidmem (class 0x40, no stack); `old` is
    untraced (no sites)."""
    doc = run_reports(inputs_from_trace(open_trace(SCENARIO_DIR / "oom_capacity_fragmentation")),
                      ["oom"])
    first = doc["oom"]["incidents"][0]
    sites = {h["pid"]: [(s["site"], s["what"], s["layer"], s["count"], s["bytes"])
                        for s in h["top_sites"]] for h in first["holders"]}
    assert sites == {100: [("load_model", "cuMemAlloc", "api", 1, 384 * MiB),
                           ("grow_cache", "cuMemAlloc", "api", 4, 128 * MiB)],
                     200: [(None, "vidmem 0x40", "rm", 1, 256 * MiB)], 300: []}


def test_active_memory_counts_an_entry_without_size_as_nothing(tmp_path: Path) -> None:
    """timeseries/active_memory from the allocator layer: train() allocates 1 MiB at
    1 s; evaluate() allocates at 2 s an entry without a size (older formats may omit
    it) and frees it at 3 s: evaluate's band never holds a byte, train's peaks at 1 MiB."""
    no_size = _entry("alloc", 2.0, 0, SEG_A + MiB, F_EVAL)
    freed = _entry("free_completed", 3.0, 0, SEG_A + MiB, F_EVAL)
    del no_size["size"], freed["size"]
    snap = {"segments": [_segment(0, SEG_A, [
        _block(SEG_A, 1 * MiB, "active_allocated", None, F_TRAIN),
        _block(SEG_A + MiB, 1 * MiB, "inactive", 0)])],
        "device_traces": [[_entry("segment_alloc", 0.5, 2 * MiB, SEG_A),
                           _entry("alloc", 1.0, 1 * MiB, SEG_A, F_TRAIN), no_size, freed]],
        "allocator_settings": {}, "external_annotations": []}
    a = active_memory(inputs_from_trace(open_trace(_snapshot_trace(tmp_path, snap))))
    peaks = {b["site"]: b["peak"] for b in a["bands"]}
    assert peaks.get("train (t.py:10)") == 1 * MiB
    assert peaks.get("evaluate (t.py:20)", 0) == 0


# --------------------------------------------------------- fault_rate, helpers/common
def test_managed_memory_past_the_gpu_is_oversubscribed(tmp_path: Path) -> None:
    """fault_rate/oversubscription: 3 GiB of cuMemAllocManaged (two processes, 1 + 2
    GiB, live together) on one 1 GiB GPU is 3x its memory: oversubscribed; 512 MiB
    is not."""
    GiB = 1 << 30
    out = {}
    for name, sizes in (("over", (1 * GiB, 2 * GiB)), ("under", (MiB * 256, MiB * 256))):
        b = TraceBuilder(("api",), duration_s=5.0, gpu_memory_bytes=GiB)
        for pid, size in zip((10, 11), sizes, strict=True):
            b.process(pid, "job")
            b.cuda_alloc(1.0 + pid / 100, pid, size, func="cuMemAllocManaged")
        out[name] = oversubscription(inputs_from_trace(open_trace(b.build(tmp_path / name))), None)
    assert out["over"] is not None and out["under"] is not None
    assert (out["over"]["managed_peak_bytes"], out["over"]["ratio"], out["over"]["oversubscribed"],
            out["over"]["source"]) == (3 * GiB, 3.0, True, "cuMemAllocManaged")
    assert (out["under"]["ratio"], out["under"]["oversubscribed"]) == (0.5, False)


def test_quantiles_are_exact_nearest_ranks() -> None:
    """helpers/common.quantiles of 0..1000 (1001 values: ranks fall on whole values):
    p50 500, p90 900, p99 990, max 1000."""
    got = pl.DataFrame({"v": list(range(1001))}).select(quantiles("v", "x_")).row(0, named=True)
    assert got == {"x_p50": 500, "x_p90": 900, "x_p99": 990, "x_max": 1000}


def test_fault_rate_migrations_evictions_batches_and_cpu_processes(tmp_path: Path) -> None:
    """fault_rate on the driver layer: migrations of 2 MiB (fault) and 64 KiB
    (eviction, GPU 0 to the CPU) are 2 migrations of 2 MiB + 64 KiB, one eviction of
    64 KiB by processor 0; batches of pid 5: 1 fault with 1 duplicate and 4 faults with
    1 duplicate: 5 faults, 2 duplicates, share 0.4; CPU faults: pid 8 three, pid 7 one:
    pid 8 first."""
    b = TraceBuilder(("syscall", "driver", "cpu_faults"), duration_s=4.0)
    for pid in (5, 7, 8):
        b.process(pid, "job")
    b.migration(1.0, -1, 0, 0x1000_0000, 2 * MiB, cause=1, pid=5)
    b.migration(1.5, 0, -1, 0x2000_0000, 64 * 1024, cause=5, pid=5)
    b.fault_batch(1.0, 0, 1, 1, 1, 0.001, pid=5)
    b.fault_batch(2.0, 0, 2, 4, 1, 0.002, pid=5)
    for t, pid in ((1.0, 7), (1.1, 8), (1.2, 8), (1.3, 8)):
        b.cpu_fault(t, pid, 0x3000_0000 + int(t * 10) * 4096, write=True)
    d = fault_rate(inputs_from_trace(open_trace(b.build(tmp_path / "t")))).data
    assert (d["migrations"]["migrations"], d["migrations"]["bytes"]) == (2, 2 * MiB + 65536)
    ev = d["evictions"]
    assert (ev["migrations"], ev["bytes"]) == (1, 65536)
    assert ev["by_processor"] == [{"processor": 0, "migrations": 1, "bytes": 65536}]
    (bt,) = d["batches"]
    assert (bt["pid"], bt["batches"], bt["faults"], bt["duplicates"]) == (5, 2, 5, 2)
    assert bt["duplicate_share"] == pytest.approx(0.4)
    assert [(p["pid"], p["faults"]) for p in d["cpu_faults"]["by_process"]] == [(8, 3), (7, 1)]


def test_duplicate_share_of_single_fault_batches() -> None:
    """fault_rate/fault_batches.batches: one batch of 1 fault, 1 of it a duplicate, is a
    duplicate share of 1.0; no faults, no share."""
    fb = pl.LazyFrame({"gpu_index": [0, 1], "pid": [5, 6], "faults": [1, 0],
                       "duplicates": [1, 0], "duration_ns": [10, 10]})
    got = {r["pid"]: r["duplicate_share"] for r in batches(fb).collect().to_dicts()}
    assert got == {5: 1.0, 6: None}


def test_holders_without_rm_query_says_so(tmp_path: Path) -> None:
    """holders: a trace without the rm_query layer says the driver's per-process
    accounting is unknown."""
    b = TraceBuilder(("syscall", "api"), duration_s=2.0)
    b.process(7, "job")
    b.cuda_alloc(1.0, 7, MiB)
    rep = holders(inputs_from_trace(open_trace(b.build(tmp_path / "t"))))
    assert ("holders: layer rm_query not recorded: the driver's per-process accounting is "
            "unknown (exited and unseen pids cannot be told)") in rep.warnings


def test_live_bytes_of_a_syscall_only_trace() -> None:
    """timeseries/memory_over_time.live_bytes: a trace of the syscall layer alone
    (scenario ioctl_latencies) has its RM series: recorded."""
    lb = live_bytes(inputs_from_trace(open_trace(SCENARIO_DIR / "ioctl_latencies")))
    assert lb["recorded"] is not False


def test_equal_cuts_split_the_trace_span(tmp_path: Path) -> None:
    """timeseries/rates_over_time.equal_cuts: a 10 s trace in 4 buckets starts them
    at 0, 2.5, 5 and 7.5 s (ns from the start), each 2.5 s wide."""
    b = TraceBuilder(("syscall",), duration_s=10.0)
    b.process(7, "job")
    cuts = equal_cuts(inputs_from_trace(open_trace(b.build(tmp_path / "t"))), 4)
    assert cuts.starts_ns == [0.0, 2.5e9, 5e9, 7.5e9] and cuts.lengths_ns == [2.5e9] * 4


# ------------------------------------------------------- seed 90210 at HEAD f2b38ed
# The survivors of a fresh seed-90210 sample (380 mutants of gputrace.analyses.*), each
# killed by the test named in docs/testing.md or listed there as equivalent.
def test_join_a_mapping_unmapped_as_the_call_begins_is_not_its_backing() -> None:
    """allocations/join._api_to_uvm: an UVM mapping unmapped at the very instant an API
    allocation call begins no longer backs the pointer it covered (unmapped at or
    before the call: the API row stays its own piece); 1 ns later it still does."""
    from gputrace.analyses.allocations.join import link
    from gputrace.analyses.helpers.lifetimes import COLUMNS

    def pieces(unmapped_at: int) -> list[int]:
        rows = {"layer": ["uvm", "api"], "pid": [1, 1], "id": [SEG_A, SEG_A + MiB],
                "what": ["external range", "cuMemAlloc"], "size_bytes": [2 * MiB, MiB],
                "alloc_ts_ns": [100, 200], "free_ts_ns": [unmapped_at, None],
                "tid": [1, 1], "call_end_ns": [110, 210], "client": [None, None],
                "handle": [None, None]}
        lt = pl.DataFrame(rows, schema={k: COLUMNS[k] for k in rows})
        return link(lt).sort("_row")["piece"].to_list()

    assert pieces(200) == [0, 1]  # freed as the call began: two pieces
    assert pieces(201) == [0, 0]  # still mapped when the call began: one piece


def test_growth_names_itself_and_each_series_point_its_action(tmp_path: Path) -> None:
    """allocator/growth.py: the report is `allocator-growth` whether or not the snapshot
    holds a history, and each series point says which entry action it follows (the
    long history's entry 0 is the segment map, 1001 evaluate's alloc)."""
    (tmp_path / "e").mkdir()
    assert growth(inputs_from_trace(open_trace(_empty_snapshot(tmp_path / "e")))).name == (
        "allocator-growth")
    g = growth(inputs_from_trace(open_trace(_snapshot_trace(tmp_path, _long_history()))))
    assert g.name == "allocator-growth"
    action = {p["entry"]: p["action"] for p in g.data["series"]}
    assert (action[0], action[500], action[1001]) == ("segment_map", "alloc", "alloc")


def test_tensors_top_keeps_the_largest_stacks(pools_trace: Path) -> None:
    """allocator/tensors.py: `top=1` keeps the one largest stack (device 0's kv_cache,
    64 MiB); the totals still count every tensor (5 alive, 105 MiB)."""
    t = tensors(inputs_from_trace(open_trace(pools_trace)), top=1).data
    assert [s["top_frame"] for s in t["by_stack"]] == ["kv_cache (serve.py:5)"]
    assert (t["total_count"], t["total_bytes"]) == (5, 105 * MiB)


def test_gate_hits_go_on_past_an_unrecorded_report() -> None:
    """run.gate_hits: a `--fail-on` condition whose report was not recorded (or left
    out) is skipped, and the conditions after it are still judged."""
    from gputrace.analyses.run import gate_hits

    frag = {"recorded": True, "gpus": [], "rm": {"gpus": [{"worst": {"unusable_share": 0.9}}]}}
    doc = {"leaks": None, "oom": {"recorded": False}, "fragmentation": frag}
    assert gate_hits(doc, [("leaks", 0.0), ("oom", 0.0), ("fragmentation", 0.5)]) == [
        "fragmentation: index 0.900 > 0.5"]


@pytest.fixture(scope="module")
def frag_doc() -> dict[str, Any]:
    from tests.analyze_helpers import analyze

    return analyze(SCENARIO_DIR / "oom_capacity_fragmentation", ["fragmentation"])


def test_rm_fragmentation_without_pmm_chunks(frag_doc: dict[str, Any]) -> None:
    """fragmentation: a trace with RM samples and no driver layer has `gpus` and
    `reservations` null (not absent); no sample failed (0, not 1); each GPU says when
    its unusable share peaked (`max_at_s`, within the trace)."""
    f = frag_doc["fragmentation"]
    assert "reservations" in f and f["reservations"] is None and f["gpus"] is None
    assert f["rm"]["failed_samples"] == 0
    (g,) = f["rm"]["gpus"]
    dur = frag_doc["trace"]["duration_s"]
    assert set(g["max_at_s"]) and all(0 <= v <= dur for v in g["max_at_s"].values())


def test_fault_rate_of_a_driver_trace_without_migrations_or_tools() -> None:
    """fault_rate: the fragmented_gpu scenario records the driver layer, no migration
    and no UVM tools events: migrations and evictions are 0 bytes (not 1), and the
    driver-events section is null (not recorded), not empty."""
    from tests.analyze_helpers import analyze

    fr = analyze(SCENARIO_DIR / "fragmented_gpu", ["fault-rate"])["fault_rate"]
    assert (fr["migrations"]["migrations"], fr["migrations"]["bytes"]) == (0, 0)
    assert (fr["evictions"]["migrations"], fr["evictions"]["bytes"]) == (0, 0)
    assert fr["driver_events"] is None and fr["uvm_counters"] is None


def test_oversubscription_ratio_per_gpu_and_uvm_events_processes(tmp_path: Path) -> None:
    """fault_rate/oversubscription.py: each GPU's `ratio` is its resident peak over its
    memory (6 decimals); uvm_events.event_counts: `processes` is the distinct pids of
    each kind and reason (synthetic events, counted by hand)."""
    from tests.analyze_helpers import analyze

    path = SCENARIO_DIR / "uvm_storm"
    fr = analyze(path, ["fault-rate"])["fault_rate"]
    rows = fr["oversubscription"]["resident_by_gpu"]
    assert rows
    for r in rows:
        assert r["ratio"] == round(r["resident_peak_bytes"] / r["gpu_memory_bytes"], 6)
    b = TraceBuilder(layers=("uvm_tools",), duration_s=1.0)  # synthetic
    for k, pid in enumerate((9, 10, 9)):
        b.uvm_event(0.1 + 0.1 * k, pid, "thrashing", SEG_A, size=2 * MiB, processors=(-1, 0))
    b.uvm_event(0.6, 9, "map_remote", SEG_A, size=2 * MiB, processor=0, residency=-1,
                reason="thrashing")
    fr = fault_rate(inputs_from_trace(open_trace(b.build(tmp_path / "t")))).data
    got = {(r["kind"], r["reason"]): (r["events"], r["processes"])
           for r in fr["driver_events"]["by_kind"]}
    # thrashing: 3 events of pids 9, 10, 9; map_remote: 1 of pid 9
    assert got == {("thrashing", None): (3, 2), ("map_remote", "thrashing"): (1, 1)}


def test_leaks_layers_say_recorded_or_not() -> None:
    """leaks: `layers` says, per leak layer, whether the trace recorded it (the
    exit_holding scenario: API and syscall, no driver layer: api, rm and uvm all
    recorded, as their trace layers are)."""
    from tests.analyze_helpers import analyze

    lk = analyze(SCENARIO_DIR / "exit_holding", ["leaks"])["leaks"]
    assert lk["layers"] == {"api": "recorded", "rm": "recorded", "uvm": "recorded"}
    only_api = analyze(SCENARIO_DIR / "ioctl_latencies", ["leaks"])["leaks"]
    assert only_api["layers"] == {"api": "not recorded", "rm": "recorded",
                                  "uvm": "recorded"}


def _bare_inputs(end_ns: int = 1) -> Any:
    from gputrace.analyses.helpers.inputs import Inputs

    return Inputs(tables={}, layers=(), start_ns=0, end_ns=end_ns)


def test_gpu_imbalance_rounded_to_six_decimals() -> None:
    """helpers/gpus.gpu_table: imbalance is max / mean rounded to 6 decimals (peaks of
    1 and 2 MiB: 2 / 1.5 = 1.333333), as every other ratio of the document."""
    from gputrace.analyses.helpers.gpus import gpu_table

    df = pl.DataFrame({"gpu_index": [0, 1], "peak_bytes": [MiB, 2 * MiB],
                       "end_bytes": [MiB, MiB]})
    t = gpu_table(_bare_inputs(), df, "rm")
    assert (t["imbalance_peak"], t["imbalance_end"]) == (1.333333, 1.0)


def test_gpu_memory_sample_of_a_full_gpu_has_no_unusable_share() -> None:
    """fragmentation/gpu_memory.samples: a sample with no free memory has no unusable
    share (null: nothing free to be unusable), not 1 - 0/0; base addresses are Int64
    whatever the table's type."""
    from gputrace.analyses.fragmentation.gpu_memory import samples

    gm = pl.LazyFrame({"gpu_index": [0, 0], "ts_ns": [10, 20], "status": [0, 0],
                       "heap_size_bytes": [8 * MiB, 8 * MiB], "heap_free_bytes": [0, 4 * MiB],
                       "largest_free_bytes": [0, 2 * MiB],
                       "largest_free_base_bytes": [0, 6 * MiB]},
                      schema_overrides={"largest_free_base_bytes": pl.UInt64})
    out = samples(gm, 0).collect()
    assert out["unusable_share"].to_list() == [None, 0.5]
    assert out.schema["largest_free_base_bytes"] == pl.Int64


def test_pmm_histogram_counts_sizes_it_has_no_name_for_as_other(tmp_path: Path) -> None:
    """fragmentation/pmm_chunks: chunk allocations of 4 KiB, 2 MiB and an 8 KiB one
    (log2 13, no named size): the histogram says 1, 1 and `other` 1."""
    b = TraceBuilder(layers=("driver",), duration_s=1.0, gpus=1, gpu_memory_bytes=64 * MiB)
    b.chunk(0.1, 0, "alloc", 0, 12)
    b.chunk(0.2, 0, "alloc", 2 * MiB, 21)
    b.chunk(0.3, 0, "alloc", 8 * MiB, 13)
    f = fragmentation(inputs_from_trace(open_trace(b.build(tmp_path / "t")))).data
    (g,) = f["gpus"]
    assert g["histogram"] == {"4KiB": 1, "64KiB": 0, "2MiB": 1, "other": 1}


def test_theil_sen_rows_with_repeated_x_falls_back_row_by_row() -> None:
    """leaks/growth.theil_sen_rows: rows whose x repeat (a pair with dx 0) are fitted one
    by one with theil_sen, the same numbers as fitting each row alone."""
    x = np.array([[0.0, 0.0, 1.0, 2.0], [0.0, 1.0, 2.0, 3.0]])
    y = np.array([[1.0, 1.0, 3.0, 5.0], [0.0, 2.0, 4.0, 6.0]])
    assert theil_sen_rows(x, y) == [theil_sen(x[0], y[0]), theil_sen(x[1], y[1])]
    assert theil_sen_rows(x, y)[1][0] == 2.0  # the second row's slope


def test_oom_pick_takes_the_incident_sample_at_the_window_edge() -> None:
    """oom/gpu_state._pick: an incident sample exactly INCIDENT_MAX_NS after the failure
    is still the failure's (the nearest periodic sample, 10 ns before, is not)."""
    from gputrace.analyses.oom.gpu_state import INCIDENT_MAX_NS, _pick

    at = 5_000_000_000
    rows = pl.DataFrame({"trigger": ["periodic", "incident"],
                         "ts_ns": [at - 10, at + INCIDENT_MAX_NS]})
    got = _pick(rows, at)
    assert got is not None and got["trigger"] == "incident"


def test_rate_cuts_use_the_reports_windows_up_to_the_limit() -> None:
    """timeseries/rates_over_time.rate_cuts: 10.4 s cut in 1 s windows is 10 windows
    (the 0.4 s remainder joins the last); with at most 10 allowed they are the report's
    own (last 1.4 s long), not 10 equal buckets of 1.04 s; with 9 allowed, 9 equal."""
    from gputrace.analyses.timeseries.rates_over_time import rate_cuts

    cuts = rate_cuts(_bare_inputs(10_400_000_000), 1.0, most=10)
    assert cuts.lengths_ns == [1e9] * 9 + [1.4e9]
    assert rate_cuts(_bare_inputs(10_400_000_000), 1.0, most=9).lengths_ns == pytest.approx(
        [10.4e9 / 9] * 9)  # more windows than allowed: equal buckets


def test_holders_driver_bytes_unknown_count_as_zero(tmp_path: Path) -> None:
    """holders.Facts.driver_at: a pid the driver lists without a byte figure counts 0
    bytes (listed, nothing known), not 1; a figure adds up over the GPUs."""
    from gputrace.analyses.holders import Facts

    b = TraceBuilder(layers=("rm_query", "syscall"), duration_s=1.0, gpus=2)  # synthetic
    b.gpu_process_memory(0.5, 0, 4242, None)
    b.gpu_process_memory(0.5, 0, 7, 3 * MiB)
    b.gpu_process_memory(0.5, 1, 7, 5 * MiB)
    f = Facts(inputs_from_trace(open_trace(b.build(tmp_path / "t"))))
    assert f.driver_at(ns(0.5), None) == {4242: 0, 7: 8 * MiB}


def test_time_series_of_a_trace_without_their_layers() -> None:
    """timeseries latency and memory_over_time on a trace with none of their layers: the
    exact not-recorded documents (`recorded` false, the latency edges still given, so a
    renderer draws empty axes)."""
    from gputrace.analyses.timeseries.latency import LATENCY_EDGES_US, latency_histograms

    inp = _bare_inputs()
    lat = latency_histograms(inp)
    assert lat["recorded"] is False and lat["edges_us"] == LATENCY_EDGES_US
    assert lat["commands"] == []
    assert live_bytes(inp) == {"recorded": False, "series": [], "omitted": 0, "fits": []}


def test_allocator_oom_state_evidence_says_what_was_requested() -> None:
    """allocator/oom_state._state: the evidence names the allocator's reserved bytes, the
    bytes in blocks and what those blocks' tensors requested (2 MiB asked, 3 MiB in
    blocks, 10 MiB reserved), its free cache and largest free block."""
    from gputrace.analyses.allocator.oom_state import _state

    o = {"device_free_bytes": MiB, "size": 8 * MiB, "cache_free_bytes": 7 * MiB,
         "reserved_bytes": 10 * MiB, "active_bytes": 3 * MiB, "requested_bytes": 2 * MiB,
         "device": 0, "seq": 5, "ts_ns": 1, "pid": 7, "stream": 0, "stack_id": None,
         "pool_id": "0,0"}
    s = _state(o, 4 * MiB, {"bytes": 0, "segment_frees": 0, "segment_unmaps": 0})
    assert ("the allocator held 10.0 MiB reserved, 3.0 MiB in blocks (2.0 MiB requested), "
            "7.0 MiB free in its cache, largest free block 4.0 MiB") in s["evidence"]
    assert (s["requested_bytes"], s["requested_active_bytes"]) == (8 * MiB, 2 * MiB)


def test_va_reservation_freed_is_not_measured() -> None:
    """fragmentation/va_reservations: of two cuMemAddressReserve ranges, the one given
    back with cuMemAddressFree is not alive at the end: one range is measured."""
    from gputrace.analyses.fragmentation.va_reservations import reservations

    calls = pl.LazyFrame({
        "ts_ns": [1, 2, 3], "pid": [7, 7, 7], "result": [0, 0, 0],
        "func": ["cuMemAddressReserve", "cuMemAddressReserve", "cuMemAddressFree"],
        "ptr": [SEG_A, SEG_B, SEG_B], "size_bytes": [64 * MiB, 64 * MiB, 0]},
        schema_overrides={"ptr": pl.UInt64})
    got = reservations(calls, 10).collect()
    assert got.height == 1 and got["base"].to_list() == [SEG_A]


def test_thrashing_blocks_name_their_process() -> None:
    """fault_rate/thrashing: a block migrated CPU -> GPU -> CPU -> GPU by pid 9 in one
    window reverses twice and is named with pid 9."""
    from gputrace.analyses.fault_rate.thrashing import thrashing

    mig = pl.LazyFrame({"ts_ns": [1, 2, 3], "address": [SEG_A] * 3, "src": [-1, 0, -1],
                        "dst": [0, -1, 0], "pid": [9, 9, None]})
    (row,) = thrashing(mig, 0, 10, 1.0, 2).collect().to_dicts()
    assert (row["pid"], row["migrations"], row["reversals"]) == (9, 3, 2)


def test_cpu_fault_blocks_ties_by_pid_then_block() -> None:
    """fault_rate/cpu_faults.cpu_blocks: blocks with as many faults are listed by pid,
    then by block (pid 5's block at 4 MiB before pid 9's at 2 MiB)."""
    from gputrace.analyses.fault_rate.cpu_faults import cpu_blocks

    f = pl.LazyFrame({"source": ["cpu"] * 2, "pid": [9, 5], "block_2m": [2 * MiB, 4 * MiB],
                      "access_type": ["read", "write"]})
    assert cpu_blocks(f).collect()["pid"].to_list() == [5, 9]


def test_growth_replay_first_and_last_times(tmp_path: Path) -> None:
    """allocator/device_replay.replay_devices: the long history's device figures are
    the whole replay's (replay.per_device), its first and last entry's times too."""
    from gputrace.analyses.allocator.device_replay import replay_devices
    from gputrace.analyses.allocator.replay import entries, per_device

    inp = inputs_from_trace(open_trace(_snapshot_trace(tmp_path, _long_history())))
    (got,) = replay_devices(inp, 400).devices
    assert [got] == per_device(entries(inp, pools=False).collect())
    assert got["last_ts_ns"] is not None and got["last_ts_ns"] > got["first_ts_ns"]


def test_pid_slices_cut_per_process_tables_by_pid(tmp_path: Path) -> None:
    """helpers/partition.pid_slices: two slices by pid mod 2: pids 2 and 4 in the first,
    3 in the second; a table of no process (gpu_memory) is whole in each."""
    from gputrace.analyses.helpers.partition import pid_slices

    b = TraceBuilder(layers=("syscall", "rm_query"), duration_s=1.0)  # synthetic
    for pid in (2, 3, 4):
        b.process(pid, f"p{pid}")
    b.gpu_memory(0.5, 0, heap=8 * MiB, free=4 * MiB, largest=4 * MiB)
    inp = inputs_from_trace(open_trace(b.build(tmp_path / "t")))
    got = [sorted(s.scan("processes").collect()["pid"].to_list()) for s in pid_slices(inp, 2)]
    assert got == [[2, 4], [3]]
    assert [s.scan("gpu_memory").collect().height for s in pid_slices(inp, 2)] == [1, 1]


def test_uvm_mapping_ends_with_its_range_freed_at_the_same_instant(tmp_path: Path) -> None:
    """helpers/uvm_ranges: a mapping at 2 MiB into a 4 MiB external range, made at the
    very instant the range is freed (the same ns), ends then with it."""
    from gputrace.analyses.helpers.uvm_ranges import uvm_lifetimes

    b = TraceBuilder(layers=("syscall",), duration_s=1.0)  # synthetic
    b.uvm(0.1, 7, "UVM_CREATE_EXTERNAL_RANGE", base=SEG_A, length=4 * MiB)
    b.uvm(0.2, 7, "UVM_MAP_EXTERNAL_ALLOCATION", base=SEG_A + 2 * MiB, length=2 * MiB,
          h_object=5)
    b.uvm(0.2, 7, "UVM_FREE", base=SEG_A, length=4 * MiB)
    inp = inputs_from_trace(open_trace(b.build(tmp_path / "t")))
    lt = uvm_lifetimes(inp.scan("ioctls"), inp.scan("mappings")).collect()
    (m,) = lt.filter(pl.col("layer") == "uvm").to_dicts()
    assert (m["id"], m["free_ts_ns"]) == (SEG_A + 2 * MiB, ns(0.2))


def test_gpu_memory_size_of_any_positive_bytes_counts() -> None:
    """helpers/gpus.memory_sizes: a manifest size is a size when positive (even 1 byte);
    0 means unknown, left out."""
    from gputrace.analyses.helpers.gpus import MANIFEST, memory_sizes
    from gputrace.analyses.helpers.inputs import Inputs

    inp = Inputs(tables={}, layers=(), start_ns=0, end_ns=1, gpu_memory_bytes=(1, 0))
    assert memory_sizes(inp) == {0: (1, MANIFEST)}


def test_records_round_every_float_column() -> None:
    """helpers/common.records: Float32 columns are rounded to 6 decimals too."""
    from gputrace.analyses.helpers.common import records

    df = pl.DataFrame({"a": [1.2345678]}, schema={"a": pl.Float32})
    (row,) = records(df)
    assert row["a"] == float(np.float32(1.234568)) != float(np.float32(1.2345678))


# --------------------------------------------------------- seed 1618 at HEAD be35c35
def test_growth_rate_and_no_warning_for_a_history_that_starts_empty(tmp_path: Path) -> None:
    """allocator/growth.py on the long history (it starts from nothing: 0 bytes active,
    reserved and requested before entry 0, which is no damage): 4 MiB grown over the
    2.2 s from its first entry to its last, 4 MiB / 2.2 s a second, and no warning that
    the entries do not add up."""
    g = growth(inputs_from_trace(open_trace(_snapshot_trace(tmp_path, _long_history()))))
    d = g.data
    assert (d["start_active_bytes"], d["start_reserved_bytes"], d["start_requested_bytes"]) == (
        0, 0, 0)
    assert d["growth_bytes"] == 4 * MiB and d["span_s"] == pytest.approx(2.2)
    assert d["growth_bytes_per_s"] == pytest.approx(4 * MiB / 2.2)
    assert not [w for w in g.warnings if "do not add up" in w], g.warnings


def test_lineup_compares_sizes_when_one_side_lacks_the_request() -> None:
    """allocator/lineup.line_up_sources: a tensor whose request only the snapshot knows
    is matched by its block size (2 MiB both): 1 matched; one whose block sizes differ
    (4 MiB live, 6 MiB in the snapshot) with a request on one side only is not."""
    live = pl.LazyFrame({"device": [0, 0], "address": [SEG_A, SEG_B],
                         "size_bytes": [2 * MiB, 4 * MiB],
                         "requested_size_bytes": [None, 4 * MiB - 8],
                         "state": ["active_allocated"] * 2},
                        schema_overrides={"requested_size_bytes": pl.Int64})
    snap = pl.LazyFrame({"device": [0, 0], "address": [SEG_A, SEG_B],
                         "size_bytes": [2 * MiB, 6 * MiB],
                         "requested_size_bytes": [2 * MiB - 100, None],
                         "state": ["active_allocated"] * 2},
                        schema_overrides={"requested_size_bytes": pl.Int64})
    from gputrace.analyses.allocator.lineup import line_up_sources

    (row,) = line_up_sources(live, snap).to_dicts()
    assert (row["matched"], row["only_live"], row["only_snapshot"]) == (1, 1, 1)


def _cache_oom_snapshot(free: int) -> dict[str, Any]:
    """One 20 MiB segment (from 1.0 s): an 8 MiB tensor at 1.1 s, 12 MiB free; `oom`
    entries at 1.5 s asking 16 MiB and at 1.6 s asking 4 MiB, each with CUDA's
    `device_free` = `free`. Nothing after them: the end state is the state then."""
    s = _segment(0, SEG_A, [_block(SEG_A, 8 * MiB, "active_allocated", None, F_TRAIN),
                            _block(SEG_A + 8 * MiB, 12 * MiB, "inactive", 0)])
    ooms = []
    for t, size in ((1.5, 16 * MiB), (1.6, 4 * MiB)):
        o = _entry("oom", t, size, 0, F_EVAL)
        del o["addr"]
        o["device_free"] = free
        ooms.append(o)
    return {"segments": [s], "device_traces": [[
        _entry("segment_alloc", 1.0, 20 * MiB, SEG_A),
        _entry("alloc", 1.1, 8 * MiB, SEG_A, F_TRAIN), *ooms]],
        "allocator_settings": {}, "external_annotations": []}


def test_oom_state_when_cuda_had_room_names_the_cache(tmp_path: Path) -> None:
    """allocator/oom_state: CUDA said 1 GiB free, so neither failure was capacity. The
    16 MiB request is over the cache's largest free block (12 MiB): fragmentation; the
    4 MiB one fits it: limit. Each evidence opens with the request, CUDA's free bytes,
    the cache's free bytes and its largest free block."""
    from gputrace.analyses.allocator.oom_state import oom_states
    from gputrace.units import format_bytes as fb

    got = oom_states(inputs_from_trace(open_trace(
        _snapshot_trace(tmp_path, _cache_oom_snapshot(1 << 30)))))
    assert [(o["requested_bytes"], o["verdict"], o["cache_free_bytes"],
             o["largest_free_block_bytes"]) for o in got] == [
        (16 * MiB, "fragmentation", 12 * MiB, 12 * MiB), (4 * MiB, "limit", 12 * MiB, 12 * MiB)]
    for o in got:
        assert o["evidence"].startswith(
            f"requested {fb(o['requested_bytes'])} <= CUDA free {fb(1 << 30)} + cache free "
            f"{fb(12 * MiB)}; largest free block in the cache {fb(12 * MiB)}; the allocator "
            f"held {fb(20 * MiB)} reserved"), o["evidence"]


def test_pool_one_unknown_request_makes_the_pools_request_unknown(tmp_path: Path) -> None:
    """allocator/pool.py: one tensor whose block carries no requested size (as a
    PyTorch 2.0 block does not) leaves its pool's and device's requested and internal
    free bytes unknown (null, not the other tensors' sum); the pool of device 1, whose
    tensors all say theirs, keeps its figures."""
    snap = _pools_snapshot()
    del snap["segments"][1]["blocks"][0]["requested_size"]  # device 0's 8 MiB tensor
    p = pool(inputs_from_trace(open_trace(_snapshot_trace(tmp_path, snap)))).data
    rows = {(r["device"], r["pool_id"], r["pool"]): r for r in p["pools"]}
    large0, large1 = rows[(0, "0,0", "large")], rows[(1, "0,0", "large")]
    assert (large0["requested_bytes"], large0["internal_free_bytes"]) == (None, None)
    assert (large1["requested_bytes"], large1["internal_free_bytes"]) == (30 * MiB, 0)
    dev = {d["device"]: d for d in p["devices"]}
    assert dev[0]["requested_bytes"] is None and dev[1]["requested_bytes"] == 30 * MiB


def test_tensors_by_stack_say_the_requested_bytes(pools_trace: Path) -> None:
    """allocator/tensors.py: each stack's requested bytes are its tensors' requests:
    train on device 0 asked 8 MiB - 100 and 1 MiB - 1 for its 9 MiB of blocks."""
    t = tensors(inputs_from_trace(open_trace(pools_trace))).data
    req = {(s["device"], s["top_frame"]): s["requested_bytes"] for s in t["by_stack"]}
    assert req[(0, "train (t.py:10)")] == 9 * MiB - 101
    assert req[(1, "train (t.py:10)")] == 30 * MiB


def test_gpu_memory_evictions_release_and_gpus_come_in_index_order() -> None:
    """helpers/gpus.gpu_memory: an evicted chunk leaves the GPU as a freed one does
    (GPU 0: 2 MiB in, evicted: peak 2 MiB, end 0), and the rows come by GPU index
    whatever order the GPUs were seen in (7 GPUs, listed backwards)."""
    gpus = list(range(6, -1, -1))
    chunks = pl.LazyFrame({
        "gpu_index": [*gpus, 0], "ts_ns": [1] * len(gpus) + [2],
        "chunk_op": ["alloc"] * len(gpus) + ["evict"], "log2_size": [21] * (len(gpus) + 1)})
    rows = gpu_memory(chunks).collect().rows()
    assert rows == [(0, 2 * MiB, 0), *[(g, 2 * MiB, 2 * MiB) for g in range(1, 7)]]


def test_site_filter_pattern_matches_whole_paths() -> None:
    """helpers/sites.SiteFilter: a pattern with `*`/`?` matches a whole path (anchored at
    both ends); a plain text is a prefix."""
    from gputrace.analyses.helpers.sites import SiteFilter

    pat = re.compile(SiteFilter.parse("*/myproj/*.py").regex())
    assert pat.match("/srv/app/myproj/train.py")
    assert not pat.match("/srv/app/myproj/train.pyc")
    assert re.match(SiteFilter.parse("/srv/app/mod?.py").regex(), "/srv/app/mod1.py")
    assert re.match(SiteFilter.parse("/srv/app").regex(), "/srv/app/anything.py")


def test_an_api_failure_on_no_known_gpu_has_no_allocator_pool(tmp_path: Path) -> None:
    """oom: a failed cuMemAlloc whose GPU nothing names (no free-memory sample, no
    allocator entry of its own, two GPUs) has no allocator pool figure (null, not 0),
    though the trace's allocator layer holds device 0's blocks."""
    b = TraceBuilder(layers=("api", "allocator"), duration_s=3.0, gpus=2)  # synthetic
    b.process(7, "train")
    for i, (act, size) in enumerate([("segment_alloc", 20 * MiB), ("alloc", MiB)]):
        b.row("allocator_events", ts_ns=ns(0.5 + 0.1 * i), seq=i, pid=7, device=0,
              action=act, address=SEG_A, size_bytes=size)
    b.row("cuda_calls", ts_ns=ns(2.0), pid=7, func="cuMemAlloc_v2", size_bytes=64 * MiB,
          ptr=0, result=2, latency_ns=1000)
    doc = run_reports(inputs_from_trace(open_trace(b.build(tmp_path / "t"))), ["oom"])
    (one,) = doc["oom"]["incidents"]
    assert one["gpu_index"] is None and one["allocator_pool_bytes"] is None


def test_a_band_hovers_the_stack_of_its_largest_allocation(tmp_path: Path) -> None:
    """timeseries/active_memory: two allocations at one user line, train (t.py:10),
    through different library calls (1 MiB by torch.empty, then 4 MiB by torch.zeros):
    one band, whose hover is the stack of the larger, 4 MiB one."""
    from gputrace.analyses.timeseries.active_memory import active_memory

    lib = "/usr/lib/python3/dist-packages/torch/"
    small = [{"name": "empty", "filename": lib + "a.py", "line": 1}, *F_TRAIN]
    big = [{"name": "zeros", "filename": lib + "b.py", "line": 2}, *F_TRAIN]
    s = _segment(0, SEG_A, [_block(SEG_A, 1 * MiB, "active_allocated", None, small),
                            _block(SEG_A + 1 * MiB, 4 * MiB, "active_allocated", None, big),
                            _block(SEG_A + 5 * MiB, 15 * MiB, "inactive", 0)])
    snap = {"segments": [s], "device_traces": [[
        _entry("segment_alloc", 1.0, 20 * MiB, SEG_A),
        _entry("alloc", 1.1, 1 * MiB, SEG_A, small),
        _entry("alloc", 1.2, 4 * MiB, SEG_A + 1 * MiB, big)]],
        "allocator_settings": {}, "external_annotations": []}
    a = active_memory(inputs_from_trace(open_trace(_snapshot_trace(tmp_path, snap))))
    (band,) = a["bands"]
    assert band["site"].startswith("train (") and band["peak"] == 5 * MiB
    assert "zeros" in band["frames"] and "empty" not in band["frames"], band["frames"]


def test_gpu_windows_tie_broken_by_pid_then_window() -> None:
    """fault_rate/fault_windows.gpu_windows: pid 5 faults twice in window 0, pid 3
    twice in window 1 (1 s windows over 2 s), same GPU: equal rates (2/s), so pid 3
    comes first though its window is later."""
    from gputrace.analyses.fault_rate.fault_windows import gpu_windows

    faults = pl.LazyFrame({"gpu_index": [0] * 4, "pid": [5, 5, 3, 3],
                           "ts_ns": [ns(0.1), ns(0.2), ns(1.1), ns(1.2)]})
    got = gpu_windows(faults, ns(0.0), ns(2.0), 1.0).collect()
    assert got.select("pid", "window_start_s", "per_s").rows() == [(3, 1.0, 2.0), (5, 0.0, 2.0)]


def test_resident_without_faults_counts_migrations_only() -> None:
    """fault_rate/migrations.resident with no fault table: 4 MiB migrated onto GPU 0 at
    1 s, 2 MiB off it at 2 s: peak 4 MiB at 1 s, end 2 MiB, nothing populated by touch."""
    from gputrace.analyses.fault_rate.migrations import resident

    mig = pl.LazyFrame({"ts_ns": [ns(1.0), ns(2.0)], "src": [-1, 0], "dst": [0, -1],
                        "size_bytes": [4 * MiB, 2 * MiB]})
    (row,) = resident(mig).collect().to_dicts()
    assert row == {"gpu_index": 0, "resident_peak_bytes": 4 * MiB,
                   "resident_end_bytes": 2 * MiB, "populated_bytes": 0,
                   "peak_ts_ns": ns(1.0)}


def test_oversubscription_without_managed_memory_says_no_ratio() -> None:
    """fault_rate/oversubscription: resident bytes but no layer that sees managed
    allocations: the managed ratio and verdict are there and null, not absent."""
    from gputrace.analyses.fault_rate.oversubscription import oversubscription

    df = pl.DataFrame({"gpu_index": [0], "resident_peak_bytes": [4 * MiB],
                       "resident_end_bytes": [2 * MiB], "populated_bytes": [0],
                       "peak_ts_ns": [1]})
    out = oversubscription(_bare_inputs(10), df)
    assert out is not None
    assert {k: out[k] for k in ("managed_peak_bytes", "ratio", "oversubscribed", "source")} == {
        "managed_peak_bytes": None, "ratio": None, "oversubscribed": None, "source": None}
    assert [r["resident_peak_bytes"] for r in out["resident_by_gpu"]] == [4 * MiB]


def test_throttling_pairs_each_start_with_the_next_end_in_time() -> None:
    """fault_rate/uvm_events.throttling: one page throttled from 1 s to 2 s and again
    from 3 s to 5 s (trace to 10 s): two closed regions, 2 s and 1 s long."""
    from gputrace.analyses.fault_rate.uvm_events import throttling

    ev = pl.LazyFrame({"pid": [9] * 4, "processor": [1] * 4, "address": [SEG_A] * 4,
                       "ts_ns": [ns(1.0), ns(3.0), ns(2.0), ns(5.0)],
                       "kind": ["throttling_start", "throttling_start",
                                "throttling_end", "throttling_end"]})
    got = throttling(ev, ns(0.0), ns(10.0)).collect()
    assert got.select("start_s", "duration_ns", "open_at_end").rows() == [
        (3.0, 2 * 10**9, False), (1.0, 1 * 10**9, False)]


def test_rm_fragmentation_end_is_the_last_sample(frag_doc: dict[str, Any]) -> None:
    """fragmentation/rm_fragmentation: a GPU's `end` is its last RM sample (the
    oom_capacity_fragmentation scenario: its latest gpu_memory row)."""
    inp = inputs_from_trace(open_trace(SCENARIO_DIR / "oom_capacity_fragmentation"))
    last = (inp.scan("gpu_memory").filter(pl.col("gpu_index") == 0).sort("ts_ns")
            .collect().row(-1, named=True))
    (g,) = frag_doc["fragmentation"]["rm"]["gpus"]
    assert g["samples"] > 1
    assert g["end"]["t_s"] == pytest.approx((last["ts_ns"] - inp.start_ns) / 1e9)
    assert g["end"]["heap_free_bytes"] == last["heap_free_bytes"]


def test_an_allocator_entry_after_an_api_failure_is_its_evidence(tmp_path: Path) -> None:
    """oom/failures._fold_layers: cuMemAlloc fails at 2.0 s on an unnamed GPU (two in
    the trace); PyTorch's `oom` entry follows 0.1 s later on device 1: one incident, the
    API failure, on GPU 1 because the allocator's entry says so, with that entry."""
    b = TraceBuilder(layers=("api", "allocator"), duration_s=3.0, gpus=2)  # synthetic
    b.process(7, "train")
    b.row("cuda_calls", ts_ns=ns(2.0), pid=7, func="cuMemAlloc_v2", size_bytes=64 * MiB,
          ptr=0, result=2, latency_ns=1000)
    b.row("allocator_events", ts_ns=ns(2.1), seq=0, pid=7, device=1, action="oom",
          size_bytes=64 * MiB, device_free_bytes=MiB)
    doc = run_reports(inputs_from_trace(open_trace(b.build(tmp_path / "t"))), ["oom"])
    (one,) = doc["oom"]["incidents"]
    assert (one["layer"], one["gpu_index"], one["gpu_from"]) == ("api", 1, "allocator")
    assert one["allocator_entry"] == {"ts_ns": ns(2.1), "requested_bytes": 64 * MiB}


def test_an_unsymbolized_frame_reads_as_perf_prints_it() -> None:
    """helpers/stacks.frame_text: a native frame without a symbol is `module+0xoffset`
    (the module's file name), else `0xip`; a Python frame is `function (file:line)`."""
    from gputrace.analyses.helpers.stacks import frame_text

    df = pl.DataFrame({
        "kind": ["native", "native", "python"], "symbol": [None, None, None],
        "module": ["/usr/lib/x86_64-linux-gnu/libfoo.so.1", None, None],
        "offset": [0x1234, None, None], "ip": [0x7F0000001234, 0x7F00DEAD, None],
        "function": [None, None, "train"], "filename": [None, None, "/home/u/t.py"],
        "line": [None, None, 10]},
        schema_overrides={"symbol": pl.String, "offset": pl.Int64, "function": pl.String,
                          "filename": pl.String, "line": pl.Int32})
    assert df.select(frame_text()).to_series().to_list() == [
        "libfoo.so.1+0x1234", "0x7f00dead", "train (t.py:10)"]


def test_holders_with_rm_query_make_no_warning_about_it() -> None:
    """holders: a trace that recorded rm_query (the oom_capacity_fragmentation
    scenario) is not told that rm_query was not recorded."""
    inp = inputs_from_trace(open_trace(SCENARIO_DIR / "oom_capacity_fragmentation"))
    assert inp.has("rm_query")
    assert not [w for w in holders(inp).warnings if "rm_query not recorded" in w]


def test_leaks_list_growing_processes_first_and_say_their_filters(tmp_path: Path) -> None:
    """leaks: pid 1 adds 8 MiB a second for 10 s and keeps it (growing: flagged), pid 2
    allocates 1 GiB once (not growth): both listed, by layer and pid; with `--top 1`
    the one kept is pid 1, the growing one, although pid 2's peak is higher. `filters`
    says the options the report ran with."""
    from gputrace.analyses.leaks import LeakOptions, leaks

    b = TraceBuilder(layers=("api",), duration_s=12.0)  # synthetic
    b.process(1, "grow")
    b.process(2, "big")
    for k in range(10):
        b.cuda_alloc(1.0 + k, 1, 8 * MiB)
    b.cuda_alloc(0.5, 2, 1 << 30)
    inp = inputs_from_trace(open_trace(b.build(tmp_path / "t")))
    r = leaks(inp)
    assert [(g["pid"], g["flagged"]) for g in r.data["growth"]] == [(1, True), (2, False)]
    assert r.data["filters"] == {"older_s": 0.0, "min_size_bytes": 0, "top": None}
    one = leaks(inp, LeakOptions(top=1)).data
    assert [(g["pid"], g["flagged"]) for g in one["growth"]] == [(1, True)]
    assert one["filters"] == {"older_s": 0.0, "min_size_bytes": 0, "top": 1}


def test_leaks_of_two_pid_slices_add_up_what_each_holds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """leaks/leaks_joined._add: cut in two pid slices (as large traces are), the
    torch_caching scenario's memory held by design and by the driver adds up to the
    one-piece figures (270 MiB PyTorch, 64 MiB cuBLAS)."""
    from gputrace.analyses.helpers import partition
    from tests.analyze_helpers import analyze

    path = SCENARIO_DIR / "torch_caching"
    whole = analyze(path, ["leaks"])["leaks"]
    monkeypatch.setattr(partition, "slice_count", lambda inp, slice_rows=None: 2)
    cut = analyze(path, ["leaks"])["leaks"]
    assert {k: v["bytes"] for k, v in cut["held_by_allocator"].items()} == {
        "cublas": 64 * MiB, "pytorch": 270 * MiB}
    for key in ("held_by_allocator", "driver_held", "reservations"):
        assert cut[key] == whole[key], key


def test_allocator_sites_keep_a_segment_whose_stack_names_no_trigger(tmp_path: Path) -> None:
    """leaks/allocator_growth: PyTorch's allocator asked for two segments, one from
    at::empty_cuda (its trigger), one from a stack that ends inside libc10_cuda (no
    Python frame, no caller outside the allocator: no trigger). Both are listed, the
    second with a null trigger."""
    from gputrace.analyses.helpers.lifetimes import lifetimes
    from gputrace.analyses.leaks.allocator_growth import allocator_growth

    site = "/usr/local/lib/python3.11/site-packages/"
    rt = ("cudaMalloc", site + "nvidia/cuda_runtime/lib/libcudart.so.12")
    c10 = ("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc",
           site + "torch/lib/libc10_cuda.so")
    b = TraceBuilder(layers=("api",), duration_s=3.0)  # synthetic
    b.process(7, "train")
    b.cuda_alloc(1.0, 7, 20 * MiB, stack=[rt, c10, ("at::empty_cuda",
                                                    site + "torch/lib/libtorch_cuda.so")])
    b.cuda_alloc(2.0, 7, 2 * MiB, stack=[rt, c10])
    inp = inputs_from_trace(open_trace(b.build(tmp_path / "t")))
    segs = allocator_growth(lifetimes(inp), inp.scan("stacks"))["allocator_segments"]
    got = sorted((r["bytes"], r["trigger"]) for r in segs.to_dicts())
    assert got == [(2 * MiB, None), (20 * MiB, "at::empty_cuda")]


def test_summary_names_exactly_the_layers_it_lacks(tmp_path: Path) -> None:
    """summary: a trace of the API layer alone lacks driver and syscall, in the
    report's own order; one with all three lacks none."""
    from gputrace.analyses.summary import summary

    for layers, lacking in ((("api",), ["driver", "syscall"]),
                            (("syscall", "api", "driver"), [])):
        b = TraceBuilder(layers=layers, duration_s=1.0)  # synthetic
        b.process(7, "job")
        b.cuda_alloc(0.5, 7, MiB)
        out = tmp_path / "-".join(layers)
        assert summary(inputs_from_trace(open_trace(b.build(out)))).missing_layers == lacking


def test_a_piece_only_the_api_layer_saw_is_sized_by_it(tmp_path: Path) -> None:
    """allocations/held.held_pieces: an API-layer trace's 1 MiB cuMemAlloc is one held
    piece seen by `api` alone and sized by it."""
    from gputrace.analyses.allocations.held import held_pieces
    from gputrace.analyses.helpers.partition import Slice

    b = TraceBuilder(layers=("api",), duration_s=2.0)  # synthetic
    b.process(7, "job")
    b.cuda_alloc(0.5, 7, MiB)
    held = held_pieces(Slice(inputs_from_trace(open_trace(b.build(tmp_path / "t")))))
    assert held.select("pid", "layers", "size_layer", "held_bytes").rows() == [
        (7, "api", "api", MiB)]


def test_holders_see_a_pid_known_only_by_its_events(tmp_path: Path) -> None:
    """holders.Facts: pid 8 has no processes row (the recorder never read it) but made
    CUDA calls: it was seen, as pid 7 (a process row) was."""
    from gputrace.analyses.holders import Facts

    b = TraceBuilder(layers=("api",), duration_s=2.0)  # synthetic
    b.process(7, "job")
    b.cuda_alloc(0.5, 7, MiB)
    b.row("cuda_calls", ts_ns=ns(0.6), pid=8, func="cuMemAlloc_v2", size_bytes=MiB,
          ptr=SEG_A, result=0, latency_ns=1000)
    assert Facts(inputs_from_trace(open_trace(b.build(tmp_path / "t")))).seen == {7, 8}


def test_memory_freed_by_closing_its_fd_is_an_fd_release(tmp_path: Path) -> None:
    """allocations/rows: 2 MiB of vidmem allocated on fd 3 at 0.2 s, the fd closed at
    0.5 s while the process runs on: the piece was freed by the fd's release, not by
    the program; one freed with RM_FREE was freed by the program."""
    from gputrace.analyses.helpers.partition import Slice

    b = TraceBuilder(layers=("syscall",), duration_s=2.0)  # synthetic
    b.process(7, "job")
    b.process(8, "job2")
    b.open_fd(0.1, 7)
    b.rm_alloc(0.2, 7, size=2 * MiB)
    b.close(0.5, 7)
    h = b.rm_alloc(0.2, 8, size=4 * MiB)
    b.rm_free(0.6, 8, handle=h)
    pieces = Slice(inputs_from_trace(open_trace(b.build(tmp_path / "t")))).model()[1]
    assert sorted(pieces.select("pid", "kind", "freed_by").rows()) == [
        (7, None, "fd release"), (8, None, "program")]


def test_memory_freed_at_the_exit_nanosecond_was_unfreed_at_exit() -> None:
    """allocations/rows.leak_kind: freed exactly as its process exited (the same ns:
    the teardown), after it, or never, with an exit: unfreed at exit; freed before the
    exit: null; never freed, no exit: alive at the end."""
    from gputrace.analyses.allocations.rows import leak_kind

    df = pl.DataFrame({"exit_ts_ns": [100, 100, 100, 100, None],
                       "free_ts_ns": [100, 101, None, 99, None]},
                      schema={"exit_ts_ns": pl.Int64, "free_ts_ns": pl.Int64})
    assert df.select(leak_kind()).to_series().to_list() == [
        "unfreed_at_exit", "unfreed_at_exit", "unfreed_at_exit", None, "alive_at_end"]


def test_pairing_keeps_times_past_2_to_the_53_exact() -> None:
    """helpers/pairing.pair: monotonic times of a host up over 104 days pass 2^53 ns,
    where a float halves inexactly: an allocation at 2^53 + 1 ns keeps that time, and
    its free at 2^53 + 3 ns is paired with it."""
    from gputrace.analyses.helpers.pairing import pair

    t = (1 << 53) + 1
    allocs = pl.LazyFrame({"pid": [7], "ptr": [SEG_A], "ts_ns": [t]})
    frees = pl.LazyFrame({"pid": [7], "ptr": [SEG_A], "ts_ns": [t + 2]})
    (row,) = pair(allocs, frees, ["pid", "ptr"]).collect().to_dicts()
    assert (row["ts_ns"], row["free_ts_ns"]) == (t, t + 2)


def test_hex_of_a_column_without_values_is_still_text() -> None:
    """helpers/sites._hex_series: offsets all null (a stack of Python frames only) give
    a text column of nulls, as a column with values gives text."""
    from gputrace.analyses.helpers.sites import _hex_series

    assert _hex_series(pl.Series([None, None], dtype=pl.Int64)).dtype == pl.String
    assert _hex_series(pl.Series([255, None], dtype=pl.Int64)).to_list() == ["0xff", None]


def test_inputs_carry_the_untracked_managed_count_of_the_manifest() -> None:
    """helpers/inputs.inputs_from_trace: the real H200 driver trace's manifest counts
    1,047,548 managed blocks the in-kernel filter could not watch (and 0 ranges); the
    inputs carry it, and the fault-rate report warns with it."""
    from tests.conftest import FIXTURES

    inp = inputs_from_trace(open_trace(FIXTURES / "real-h200-driver-cuda" / "trace"))
    assert inp.untracked_managed == 1_047_548
    assert [w for w in fault_rate(inp).warnings if "1047548 managed blocks" in w]


def test_the_first_report_looked_up_finds_the_registry(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """registry.spec before anything listed the reports (as in a fresh interpreter):
    the registry is made on that first look-up, and kept."""
    monkeypatch.delitem(vars(registry), "REPORTS")
    assert registry.spec("oom").key == "oom"
    assert [s.name for s in vars(registry)["REPORTS"]][:2] == ["leaks", "fault-rate"]
