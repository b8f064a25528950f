"""Leaks, summary and memory over time computed one pid slice at a time (as on large
traces) give the same JSON as in one piece: every scenario and recorded fixture, cut
2 and 5 ways."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gputrace.analyses.helpers import partition
from gputrace.analyses.helpers.inputs import inputs_from_trace
from gputrace.analyses.timeseries import memory_over_time
from gputrace.trace.reader import open_trace
from tests.analyze_helpers import GOLDEN, SCENARIO_DIR, analyze, scenarios
from tests.conftest import FIXTURES
from tests.goldens import joined_json

TRACES = [SCENARIO_DIR / n for n in scenarios().SCENARIOS] + [
    FIXTURES / n for n in ("standin-rm", "standin-cuda", "standin-faults")]


def golden(path: Path) -> dict[str, Any]:
    name = (f"analyze_{path.name}" if path.parent == SCENARIO_DIR
            else f"recorded_{path.name.replace('-', '_')}")
    return joined_json(GOLDEN / name)


@pytest.mark.parametrize("k", [2, 5])
@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_sliced_reports_equal_whole(path: Path, k: int,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(partition, "slice_count", lambda inp, slice_rows=None: k)
    assert analyze(path) == golden(path)


def test_slices_cover_every_pid_once() -> None:
    inp = inputs_from_trace(open_trace(FIXTURES / "standin-rm"))
    whole = inp.scan("ioctls").collect()
    parts = [p.scan("ioctls").collect() for p in partition.pid_slices(inp, 3)]
    assert sum(p.height for p in parts) == whole.height
    assert all(set(a["pid"]).isdisjoint(b["pid"]) for i, a in enumerate(parts)
               for b in parts[i + 1:])
    assert partition.slice_count(inp) == 1



@pytest.mark.parametrize("k", [2, 5])
@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_sliced_memory_over_time_equals_whole(path: Path, k: int,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Live bytes (series, names, omitted count, growth fits) and RM bytes per GPU computed
    per pid slice equal the one-piece result; with every series drawn and flagged too,
    so none is left out of the comparison."""
    inp = inputs_from_trace(open_trace(path))
    rm_only = replace(inp, layers=tuple(x for x in inp.layers if x != "driver"))
    drawn = memory_over_time.live_bytes(inp, 50, max_series=None)
    every = {(s["layer"], s["pid"]) for s in drawn["series"]}

    def results() -> list[dict[str, Any]]:
        return [memory_over_time.live_bytes(inp, 50, every, None),
                memory_over_time.live_bytes(inp, 50),
                memory_over_time.gpu_bytes(rm_only, 50)]

    whole = results()
    monkeypatch.setattr(partition, "slice_count", lambda inp, slice_rows=None: k)
    assert results() == whole
    assert whole[0] == {**drawn, "fits": whole[0]["fits"]}
