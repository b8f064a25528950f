"""The oom report on a real H200 capture (fixtures/real-h200-driver-cuda): the workload
asks cudaMalloc for 1 TiB and gets cudaErrorMemoryAllocation (truth.json `oom`: its
size, CUresult 2 and the CLOCK_MONOTONIC times around the call). The driver refused it
twice inside the one call (RM_ALLOC, NV_ERR_NO_MEMORY); the recorder sampled the GPU's
free memory every 100 ms (layer rm_query; this capture predates incident samples and
per-process accounting)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.analyze_helpers import analyze
from tests.conftest import FIXTURES

CUDA = FIXTURES / "real-h200-driver-cuda"
H200_HEAP = 150_109_880_320  # RM heap size of this H200 (PROVENANCE.json): 139.8 GiB
MIB = 1 << 20


@pytest.fixture(scope="module")
def truth() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CUDA / "truth.json").read_text())
    return data


@pytest.fixture(scope="module")
def rep() -> dict[str, Any]:
    doc: dict[str, Any] = analyze(CUDA / "trace", ["oom"])["oom"]
    return doc


def test_the_1tib_cudamalloc_is_one_capacity_incident(rep: dict[str, Any],
                                                      truth: dict[str, Any]) -> None:
    oom = truth["oom"]
    assert (rep["count"], rep["failures"]) == (1, 1)
    inc = rep["incidents"][0]
    assert (inc["verdict"], inc["requested_bytes"], inc["status"], inc["pid"], inc["comm"],
            inc["call"], inc["gpu_index"]) == (
        "capacity", oom["size"], oom["rc"], truth["pid"], truth["workload"],
        "cuMemAlloc_v2", 0)
    assert oom["size"] == 1 << 40
    assert oom["t0_ns"] <= inc["ts_ns"] <= oom["t1_ns"]
    assert "cudaMalloc < main" in inc["stack"]
    # the driver's own two refusals inside the call are its evidence, not incidents
    assert [(n["call"], n["status"]) for n in inc["nested"]] == [("RM_ALLOC", 0x51)] * 2


def test_the_gpu_at_that_instant(rep: dict[str, Any], truth: dict[str, Any]) -> None:
    g = rep["incidents"][0]["gpu"]
    assert g["total_bytes"] == H200_HEAP
    assert round(g["total_bytes"] / (1 << 30), 1) == 139.8
    # no incident sample in this capture: the nearest periodic one, within its 100 ms
    assert g["sample_trigger"] is None and abs(g["sample_distance_ns"]) <= 100_000_000
    # cudaMemGetInfo at init said 149,557,477,376 free: RM's free is that, less the
    # context memory allocated since (a few MiB), far below the 1 TiB asked
    assert 0 <= truth["init"]["mem_free"] - g["free_bytes"] <= 64 * MIB
    assert g["largest_free_bytes"] <= g["free_bytes"] < truth["oom"]["size"]


def test_the_program_itself_is_the_holder(rep: dict[str, Any], truth: dict[str, Any]) -> None:
    """Only the workload holds the GPU; at the failure it still held the 64 MiB cuMemAlloc
    and the five 1 MiB cudaMallocs it never frees (truth.json's leaked pointers)."""
    (h,) = rep["incidents"][0]["holders"]
    api = (len(truth["drv_64m"]["leaked"]) * truth["drv_64m"]["size"]
           + len(truth["malloc_1m"]["leaked"]) * truth["malloc_1m"]["size"])
    assert (h["pid"], h["comm"], h["traced"], h["driver_bytes"], h["api_bytes"]) == (
        truth["pid"], truth["workload"], True, None, api)
    assert api == 69 * MIB
