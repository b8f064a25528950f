"""Planted truth of each synthetic scenario (fixtures/scenarios/build.py), asserted
directly, and each scenario's JSON report kept as golden files, one per report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gputrace.render.json_doc import render_json
from gputrace.trace.builder import T0_NS, GiB, MiB
from tests.analyze_helpers import GOLDEN, SCENARIO_DIR, analyze, scenarios
from tests.goldens import DOCUMENT, check_text, joined_json, json_parts, report_keys, stale_files

# One pytest-xdist worker runs every test here: they share `docs` (every scenario
# analyzed), built once per worker.
pytestmark = pytest.mark.xdist_group("analyze_scenarios")

NAMES = list(scenarios().SCENARIOS)


@pytest.fixture(scope="module")
def docs() -> dict[str, dict[str, Any]]:
    return {name: analyze(SCENARIO_DIR / name) for name in NAMES}


def leaks_of(doc: dict[str, Any]) -> list[tuple[str, int, str, int]]:
    return sorted((a["layer"], a["pid"], a["kind"], a["size_bytes"])
                  for a in doc["leaks"]["allocations"])


def test_training_loop_leaks_one_buffer_per_iteration(docs: dict[str, Any]) -> None:
    lk = docs["training_leak"]["leaks"]
    assert leaks_of(docs["training_leak"]) == [("api", 1000, "alive_at_end", 8 * MiB)] * 20
    assert lk["total_bytes"] == 160 * MiB
    assert lk["bytes_by_layer"] == {"api": 160 * MiB, "rm": 0, "uvm": 0}
    assert [(s["frames"], s["count"]) for s in lk["by_stack"]] == [
        ("cache_grad < train_step < main", 20)]
    (g,) = lk["growth"]
    assert g["flagged"] and lk["growing_pids"] == [1000]
    assert g["slope_bytes_per_min"] == pytest.approx(8 * MiB * 60, rel=0.05)
    assert g["r2"] > 0.95


def test_process_exiting_with_memory(docs: dict[str, Any]) -> None:
    doc = docs["exit_holding"]
    assert leaks_of(doc) == [("api", 2000, "unfreed_at_exit", 64 * MiB),
                             ("rm", 2000, "unfreed_at_exit", 32 * MiB),
                             ("rm", 2001, "alive_at_end", 16 * MiB)]
    # the 64 MiB virtual reservation is reported apart, never as leaked memory
    assert doc["leaks"]["rm_virtual_unreleased"] == {"count": 1, "bytes": 64 * MiB}
    api = next(a for a in doc["leaks"]["allocations"] if a["layer"] == "api")
    assert api["stack_id"] is not None and api["comm"] == "worker"
    rm = next(a for a in doc["leaks"]["allocations"] if a["layer"] == "rm")
    assert rm["stack_id"] is None and rm["alloc_ts_ns"] == T0_NS + 1_000_000_000


def test_handle_reuse_only_last_allocation_leaks(docs: dict[str, Any]) -> None:
    doc = docs["handle_reuse"]
    assert leaks_of(doc) == [("api", 3000, "alive_at_end", 3 * MiB),
                             ("rm", 3000, "alive_at_end", 16 * MiB),
                             ("uvm", 3000, "alive_at_end", 2 * MiB),
                             ("uvm", 3000, "alive_at_end", 32 * MiB)]
    assert {a["alloc_ts_ns"] for a in doc["leaks"]["allocations"]} == {T0_NS + 5 * 10**9}


def test_uvm_oversubscription_storm(docs: dict[str, Any]) -> None:
    fr = docs["uvm_storm"]["fault_rate"]
    blocks = fr["thrashing"]["blocks"]
    assert sorted(b["block_2m"] for b in blocks) == [0x7E0000000000, 0x7E0000200000]
    assert all(b["reversals"] == 6 and b["migrations"] == 7 for b in blocks)
    assert fr["oversubscription"]["ratio"] == pytest.approx(3.0)
    assert fr["oversubscription"]["oversubscribed"] is True
    assert fr["evictions"]["migrations"] == 4 and fr["evictions"]["bytes"] == 8 * MiB
    (batch,) = fr["batches"]
    assert batch["batches"] == 2 and batch["duplicate_share"] == pytest.approx(0.6)
    assert fr["cpu_faults"]["total"] == 7 and fr["cpu_faults"]["writes"] == 2
    assert fr["cpu_faults"]["top_blocks"][0]["faults"] == 6


def test_fragmented_gpu_half_free_but_no_2m_run(docs: dict[str, Any]) -> None:
    (gpu,) = docs["fragmented_gpu"]["fragmentation"]["gpus"]
    end = gpu["end"]
    assert end["free_bytes"] == 32 * MiB and end["used_bytes"] == 32 * MiB
    assert end["largest_free_run_bytes"] == 64 * 1024
    assert end["unusable_2m_bytes"] == 32 * MiB
    assert end["partial_root_share"] == 1.0
    assert end["fragmentation_index"] == pytest.approx(1 - 64 * 1024 / (32 * MiB))
    assert gpu["peak"]["free_bytes"] == 0 and gpu["peak"]["fragmentation_index"] is None
    assert gpu["histogram"]["64KiB"] == 1024


def test_two_gpus_one_full(docs: dict[str, Any]) -> None:
    g = docs["two_gpus"]["summary"]["gpus"]
    assert [(x["gpu_index"], x["peak_bytes"], x["full"]) for x in g["gpus"]] == [
        (0, 1 * GiB, True), (1, 16 * MiB, False)]
    assert g["imbalance_peak"] == pytest.approx(1024 / ((1024 + 16) / 2), abs=1e-6)
    frag = docs["two_gpus"]["fragmentation"]["gpus"]
    assert frag[0]["end"]["free_bytes"] == 0 and frag[1]["end"]["fragmentation_index"] == 0.0


def test_layers_not_recorded_say_so(docs: dict[str, Any]) -> None:
    doc = docs["training_leak"]  # syscall + api only
    assert doc["fault_rate"]["recorded"] is False
    assert doc["fault_rate"]["not_recorded_layers"] == ["cpu_faults", "driver", "uvm_tools"]
    assert "rates" not in doc["fault_rate"]
    assert doc["fragmentation"]["recorded"] is False
    frag = docs["fragmented_gpu"]  # syscall + driver: no api layer
    assert frag["leaks"]["bytes_by_layer"]["api"] is None
    assert frag["leaks"]["layers"]["api"] == "not recorded"


def test_cpu_faults_alone_leave_gpu_sections_null(tmp_path: Path) -> None:
    """A trace with CPU faults but no driver layer: 3 faults (2 writes) in one block
    of pid 5; GPU batches, thrashing and evictions are null, never zero."""
    from gputrace.trace.builder import TraceBuilder

    b = TraceBuilder(layers=("syscall", "cpu_faults"), duration_s=3.0)
    b.process(5, "touch")
    base = 0x200000000000
    b.mmap_managed(0.0, 5, base, 4 * MiB)
    for k, write in enumerate([True, False, True]):
        b.cpu_fault(1.0 + k * 0.1, 5, base + k * 0x1000, write=write)
    fr = analyze(b.build(tmp_path / "t"), ["fault-rate"])["fault_rate"]
    assert fr["recorded"] is True and fr["not_recorded_layers"] == ["driver", "uvm_tools"]
    assert (fr["batches"], fr["thrashing"], fr["evictions"]) == (None, None, None)
    (proc,) = fr["cpu_faults"]["by_process"]
    assert (proc["pid"], proc["faults"], proc["reads"], proc["writes"], proc["blocks"]) == (
        5, 3, 1, 2, 1)
    assert fr["cpu_faults"]["top_blocks"][0]["block_2m"] == base
    assert any("driver layers (driver, uvm_tools) not recorded" in w for w in fr["warnings"])


def test_warnings_for_incomplete_trace_and_drops(tmp_path: Path) -> None:
    from gputrace.trace.builder import TraceBuilder

    b = TraceBuilder(status="recording", drops={"ioctl_events": 12})
    b.process(1, "x")
    b.rm_alloc(0.0, 1, size=MiB)
    doc = analyze(b.build(tmp_path / "t"))
    assert len(doc["warnings"]) == 2
    for key in ("leaks", "fault_rate", "fragmentation", "summary"):
        text = " ".join(doc[key]["warnings"])
        assert "recording" in text and "12 events were dropped" in text


def test_committed_fixtures_match_build_script(tmp_path: Path,
                                               docs: dict[str, Any]) -> None:
    built = scenarios().build_all(tmp_path)
    for name, path in built.items():
        assert analyze(path) == docs[name], f"fixtures/scenarios/{name} is stale: rebuild it"


PARTS = [*report_keys(), DOCUMENT]
WHOLE = "training_leak"
"""The one scenario whose whole JSON document is a golden too (how the parts join)."""


@pytest.mark.parametrize("part", PARTS)
@pytest.mark.parametrize("name", NAMES)
def test_golden_json(name: str, part: str, docs: dict[str, Any], update_golden: bool) -> None:
    """Each report's JSON object, per scenario, in a golden of its own."""
    check_text(GOLDEN / f"analyze_{name}" / f"{part}.json",
               render_json(json_parts(docs[name])[part]), update_golden)


def test_whole_document_golden(docs: dict[str, Any], update_golden: bool) -> None:
    check_text(GOLDEN / f"analyze_{WHOLE}.json", render_json(docs[WHOLE]), update_golden)


def test_golden_parts_join_into_the_whole_document() -> None:
    """The per-report goldens, put back together, are the whole document's golden byte
    for byte (they were cut from it)."""
    assert render_json(joined_json(GOLDEN / f"analyze_{WHOLE}")) == (
        GOLDEN / f"analyze_{WHOLE}.json").read_text()


def test_no_golden_of_an_unregistered_report() -> None:
    for name in NAMES:
        assert stale_files(GOLDEN / f"analyze_{name}", [f"{p}" for p in PARTS]) == [], name


def test_default_fixture_story() -> None:
    """fixtures/make_default.py: 10 x 1 MiB leaked from log_metrics, 256 MiB at exit."""
    from tests.conftest import FIXTURES

    lk = analyze(FIXTURES / "default", ["leaks"])["leaks"]
    api = [(a["comm"], a["kind"], a["size_bytes"]) for a in lk["allocations"]
           if a["layer"] == "api"]
    assert sorted(api) == sorted([("preprocess", "unfreed_at_exit", 256 * MiB)]
                                 + [("train.py", "alive_at_end", MiB)] * 10)
    stacks = {s["frames"]: s["count"] for s in lk["by_stack"]}
    assert stacks["log_metrics < train_step < main"] == 10
    # 1 MiB leaked per iteration under a 64 MiB temporary: the troughs climb.
    growing = {(g["layer"], g["pid"]) for g in lk["growth"] if g["flagged"]}
    assert growing == {("api", 4242), ("rm", 4242)}


def test_fragmentation_within_reserved_va_range(tmp_path: Path) -> None:
    """A 64 MiB cuMemAddressReserve range with every other 2 MiB slot mapped."""
    from gputrace.trace.builder import TraceBuilder

    b = TraceBuilder(duration_s=2.0)
    b.process(1, "vmm")
    base = 0x7F0000000000
    b.cuda_alloc(0.0, 1, 64 * MiB, func="cuMemAddressReserve", ptr=base)
    for k in range(0, 32, 2):
        b.cuda_alloc(1.0, 1, 2 * MiB, func="cuMemMap", ptr=base + k * 2 * MiB)
    (res,) = analyze(b.build(tmp_path / "t"), ["fragmentation"])["fragmentation"]["reservations"]
    assert (res["base"], res["size_bytes"], res["free_bytes"]) == (base, 64 * MiB, 32 * MiB)
    assert res["largest_free_run_bytes"] == 2 * MiB
    assert res["fragmentation_index"] == pytest.approx(1 - 1 / 16)
