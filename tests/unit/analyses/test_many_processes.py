"""Traces of very many processes (a fork bomb recorded host-wide, a driver whose
accounting lists 10^5 pids) give reports whose lists are bounded and whose totals
still count every row (docs/security.md, "Reports of many processes"). Synthetic
traces (gputrace.trace.builder); each expected figure is computed here from the
scenario, not read from the report:

- leaks: MAX_ROWS + 50 processes, each two allocations of (1 + i % 7) MiB never
  freed: every per-process and per-allocation list holds MAX_ROWS rows, `left_out`
  counts the rest, the totals and held_at_end add up all of them (unbounded, 10^6
  processes were gigabytes of JSON and the analysis was killed at 8 GiB);
- oom and holders: one failed allocation while the driver charges 20,000 pids it
  never saw (pid i: i MiB): MAX_HOLDERS holders listed, the largest first, the rest
  counted and added up (10^5 pids once took 206 s);
- the live aggregates keep at most MAX_DRIVER_PIDS pids of a round of the driver's
  accounting, whatever a driver lists.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from gputrace import schema
from gputrace.analyses import holders, leaks
from gputrace.analyses.oom.holders import MAX_HOLDERS
from gputrace.live import aggregates
from gputrace.trace.builder import GiB, MiB, TraceBuilder, ns
from tests.analyze_helpers import analyze

DRIVER_PIDS = 20_000
FIRST_PID = 10_000
MAX_S = 60.0  # one analysis on 2 shared CPUs (about 5 s here at 10^5 pids)


@pytest.fixture(scope="module")
def many_leaks(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[int]]:
    n = leaks.MAX_ROWS + 50
    b = TraceBuilder(("api",), duration_s=20.0)  # synthetic
    sizes = []
    for i in range(n):
        size = MiB * (1 + i % 7)
        b.process(1000 + i, "worker", start=0.5, exit=19.0)
        b.cuda_alloc(1.0 + i * 1e-6, 1000 + i, size)
        b.cuda_alloc(5.0 + i * 1e-6, 1000 + i, size)
        sizes.append(2 * size)
    doc = analyze(b.build(tmp_path_factory.mktemp("leaks") / "t"), ["leaks"])
    return doc["leaks"], sizes


def test_leak_lists_hold_at_most_max_rows(many_leaks: tuple[dict[str, Any], list[int]]) -> None:
    rep, per_process = many_leaks
    n = len(per_process)
    for key in ("by_process", "allocations", "growth", "leaked"):
        assert len(rep[key]) == leaks.MAX_ROWS, key
    assert len(rep["held_at_end"]["processes"]) == leaks.MAX_ROWS
    left = rep["left_out"]
    assert left["by_process"] == left["held_at_end"] == left["growth"] == n - leaks.MAX_ROWS
    assert left["allocations"] == 2 * n - leaks.MAX_ROWS


def test_leak_totals_count_every_process(many_leaks: tuple[dict[str, Any], list[int]]) -> None:
    rep, per_process = many_leaks
    assert rep["total_bytes"] == rep["bytes_by_layer"]["api"] == sum(per_process)
    assert rep["total_count"] == 2 * len(per_process)
    assert rep["held_at_end"]["bytes"] == sum(per_process)
    # largest first: the listed processes are the largest ones
    listed = [p["held_bytes"] for p in rep["held_at_end"]["processes"]]
    assert listed == sorted(per_process, reverse=True)[: leaks.MAX_ROWS]


@pytest.fixture(scope="module")
def many_driver_pids(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], float]:
    b = TraceBuilder(("syscall", "api", "rm_query"), duration_s=20.0,
                     gpu_memory_bytes=80 * GiB)  # fmt: skip  (synthetic)
    b.process(7, "job", start=0.5)
    b.cuda_alloc(10.0, 7, GiB, result=2)
    b.gpu_memory(10.001, 0, heap=80 * GiB, free=0, largest=0, trigger="incident",
                 delay_ns=990_000)  # fmt: skip
    for i in range(DRIVER_PIDS):
        b.gpu_process_memory(10.001, 0, FIRST_PID + i, (i + 1) * MiB, trigger="incident")
    path = b.build(tmp_path_factory.mktemp("oom") / "t")
    t0 = time.monotonic()
    doc = analyze(path, ["oom", "holders"])
    return doc, time.monotonic() - t0


def test_an_oom_lists_the_largest_holders_and_adds_up_the_rest(
        many_driver_pids: tuple[dict[str, Any], float]) -> None:
    doc, took = many_driver_pids
    assert took < MAX_S
    (inc,) = doc["oom"]["incidents"]
    listed = inc["holders"]
    assert len(listed) == MAX_HOLDERS
    charged = [(i + 1) * MiB for i in range(DRIVER_PIDS)]
    want = sorted(charged, reverse=True)
    assert [h["driver_bytes"] for h in listed] == want[: MAX_HOLDERS]
    rest = inc["holders_left_out"]
    assert rest["count"] == DRIVER_PIDS - MAX_HOLDERS  # the job holds nothing: no holder
    assert rest["driver_bytes"] == sum(want[MAX_HOLDERS :])


def test_holders_list_at_most_max_listed_cases(
        many_driver_pids: tuple[dict[str, Any], float]) -> None:
    doc, _ = many_driver_pids
    for instant in doc["holders"]["instants"]:
        cases = instant["cases"]
        assert len(cases) == holders.MAX_LISTED
        assert {c["case"] for c in cases} == {"unseen"}
        total = DRIVER_PIDS * (DRIVER_PIDS + 1) // 2 * MiB
        listed = sum(c["bytes"] for c in cases)
        assert instant["left_out"]["cases"] == DRIVER_PIDS - holders.MAX_LISTED
        assert listed + instant["left_out"]["cases_bytes"] == total


def test_live_aggregates_keep_a_bounded_round_of_driver_pids() -> None:
    n = aggregates.MAX_DRIVER_PIDS + 10
    rows = {"ts_ns": [ns(1.0)] * n, "gpu_index": [0] * n, "pid": list(range(1, n + 1)),
            "vidmem_bytes": [MiB] * n, "trigger": ["tick"] * n, "status": [0] * n}
    t = pa.Table.from_pylist(
        [dict(zip(rows, v, strict=True)) for v in zip(*rows.values(), strict=True)],
        schema=schema.table("gpu_process_memory").arrow_schema)
    agg = aggregates.Aggregates()
    agg.observe("gpu_process_memory", t)
    assert agg.orphaned() == {0: aggregates.MAX_DRIVER_PIDS * MiB}


def test_the_bounds_are_the_documented_ones() -> None:
    doc = (Path(__file__).resolve().parents[3] / "docs" / "security.md").read_text()
    for name, value in (("leaks.MAX_ROWS", leaks.MAX_ROWS),
                        ("oom.holders.MAX_HOLDERS", MAX_HOLDERS),
                        ("holders.MAX_LISTED", holders.MAX_LISTED),
                        ("live.aggregates.MAX_DRIVER_PIDS", aggregates.MAX_DRIVER_PIDS)):
        assert f"| `{name}` | {value:,} |" in doc, name
