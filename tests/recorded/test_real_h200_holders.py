"""Who held the H200 when the 1 TiB cudaMalloc failed, each byte told once (the real
captures fixtures/real-h200-cuda and real-h200-driver-cuda*/trace).

The workload holds its CUDA context and runtime (RM video memory it never asked
for, ~520 MiB), the 64 MiB cuMemAlloc and five 1 MiB cudaMallocs it never frees
(truth.json). The API (69 MiB), RM (588 MiB) and UVM (668 MiB: external mappings of
the same RM objects, plus the context's managed range) layers each see part of the
same memory: a holder's one figure may never exceed the largest of them (adding
them gave 1.3 GiB), and a piece seen by three layers is one row of a site table.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from gputrace.analyses.allocations.held import live_at, sites
from gputrace.analyses.helpers.inputs import inputs_from_trace
from gputrace.analyses.oom.holders import Recorded
from gputrace.trace.reader import open_trace
from tests.analyze_helpers import analyze
from tests.conftest import FIXTURES

MIB = 1 << 20
TRACES = [FIXTURES / "real-h200-cuda", FIXTURES / "real-h200-driver-cuda" / "trace",
          FIXTURES / "real-h200-driver-cuda-clock" / "trace"]


def _truth(trace: Path) -> dict[str, Any]:
    for name in ("TRUTH.json", "../truth.json"):
        if (trace / name).exists():
            got: dict[str, Any] = json.loads((trace / name).read_text())
            return got
    raise AssertionError(f"no truth beside {trace}")


@pytest.fixture(scope="module", params=TRACES, ids=lambda p: p.parent.name + "/" + p.name)
def case(request: pytest.FixtureRequest) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    trace: Path = request.param
    (inc,) = analyze(trace, ["oom"])["oom"]["incidents"]
    return trace, inc, _truth(trace)


def test_held_and_grown_at_most_the_largest_layer(case: Any) -> None:
    _, inc, truth = case
    (h,) = inc["holders"]
    largest = max(h["api_bytes"], h["rm_bytes"], h["uvm_bytes"])
    assert 0 < h["held_bytes"] <= largest
    assert 0 < h["grew_bytes"] <= largest
    # the figure is the driver's memory (RM video memory) plus the one managed range
    # no RM object backs: never the three layers added (1.3 GiB before)
    assert h["rm_bytes"] <= h["held_bytes"] <= h["rm_bytes"] + 2 * MIB
    assert h["held_bytes"] < h["api_bytes"] + h["rm_bytes"]
    # the program's part covers the memory it asked for (69 MiB by truth.json), each
    # cudaMalloc in the 2 MiB RM object the driver sub-allocated it from
    api = (len(truth["drv_64m"]["leaked"]) * truth["drv_64m"]["size"]
           + len(truth["malloc_1m"]["leaked"]) * truth["malloc_1m"]["size"])
    assert api <= h["held_by_class"]["program"] <= api + 4 * MIB
    assert sum(h["held_by_class"].values()) == h["held_bytes"]


def test_each_piece_once_in_the_site_tables(case: Any) -> None:
    trace, inc, _ = case
    (h,) = inc["holders"]
    for table in ("top_sites", "grew_sites"):
        rows = h[table]
        # no piece is listed once per layer: every row names all its layers
        labels = [(s["class"], s["what"], s["stack"]) for s in rows]
        assert len(labels) == len(set(labels)), rows
        assert sum(s["bytes"] for s in rows) <= h["held_bytes"]
    # every site of the holder, not only the top 3: they add up to its figure exactly
    rec = Recorded(inputs_from_trace(open_trace(trace)))
    mine = rec.held.filter(pl.col("pid") == h["pid"])
    every = sites(mine, live_at(inc["end_ns"] if "end_ns" in inc else inc["ts_ns"])
                  .cast(pl.Int64), 10**6)
    assert int(every["bytes"].sum()) == h["held_bytes"]
