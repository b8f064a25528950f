"""A real capture (one NVIDIA H200, driver 580.159.04, CUDA 13.0): the API-layer
report against the workload's own log (fixtures/real-h200-cuda/TRUTH.json), which
the code under test never wrote."""

from __future__ import annotations

import json
from typing import Any

import polars as pl
import pytest

from gputrace.trace.reader import open_trace
from tests.analyze_helpers import analyze
from tests.conftest import FIXTURES

H200 = FIXTURES / "real-h200-cuda"
TIB = 1 << 40


@pytest.fixture(scope="module")
def truth() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((H200 / "TRUTH.json").read_text())
    return data


@pytest.fixture(scope="module")
def calls() -> pl.DataFrame:
    return open_trace(H200).scan("cuda_calls").collect()


@pytest.fixture(scope="module")
def leaks() -> dict[str, Any]:
    doc: dict[str, Any] = analyze(H200, ["leaks"])["leaks"]
    return doc


def _ptrs(hexes: list[str]) -> set[int]:
    return {int(h, 16) for h in hexes}


def test_recorded_not_synthetic_and_complete() -> None:
    prov = json.loads((H200 / "PROVENANCE.json").read_text())
    assert prov["recorded"] is True and prov["synthetic"] is False
    t = open_trace(H200)
    assert t.status == "complete" and not t.manifest.get("synthetic")
    assert sum(t.drops.values()) == 0
    assert set(t.layers) == {"syscall", "cpu_faults", "api"}


def test_api_leaks_are_the_six_the_workload_kept(truth: dict[str, Any],
                                                 leaks: dict[str, Any]) -> None:
    api = [a for a in leaks["allocations"] if a["layer"] == "api"]
    assert len(api) == 6
    assert sum(a["size_bytes"] for a in api) == truth["expected_leak_bytes"] == 72_351_744
    assert leaks["bytes_by_layer"]["api"] == 72_351_744
    leaked = _ptrs(truth["malloc_1m"]["leaked"]) | _ptrs(truth["drv_64m"]["leaked"])
    assert {a["id"] for a in api} == leaked
    assert {a["pid"] for a in api} == {truth["pid"]}
    assert {a["kind"] for a in api} == {"unfreed_at_exit"}  # it exited without freeing
    sizes = sorted(a["size_bytes"] for a in api)
    assert sizes == [truth["malloc_1m"]["size"]] * 5 + [truth["drv_64m"]["size"]]


def test_api_leak_stacks_name_cudamalloc_and_main(leaks: dict[str, Any]) -> None:
    by = {(s["count"], s["bytes"]): s["frames"] for s in leaks["by_stack"] if s["layer"] == "api"}
    assert set(by) == {(5, 5 << 20), (1, 64 << 20)}
    assert "cudaMalloc < main" in by[(5, 5 << 20)]
    assert by[(1, 64 << 20)].startswith("main <")


def test_the_1_tib_failure(truth: dict[str, Any], calls: pl.DataFrame) -> None:
    oom = truth["oom"]
    assert (oom["size"], oom["rc"]) == (TIB, 2)
    failed = calls.filter(pl.col("result") != 0)
    assert failed.select("func", "size_bytes", "result").rows() == [("cuMemAlloc_v2", TIB, 2)]
    ts = failed["ts_ns"][0]
    assert oom["t0_ns"] <= ts <= oom["t1_ns"]


def test_every_step_is_in_its_time_window(truth: dict[str, Any], calls: pl.DataFrame) -> None:
    """Each recorded allocation of a step lies inside that step's [t0, t1] (monotonic)."""
    def in_window(step: str, func: str, size: int) -> pl.DataFrame:
        s = truth[step]
        return calls.filter((pl.col("func") == func) & (pl.col("size_bytes") == size)
                            & pl.col("ts_ns").is_between(s["t0_ns"], s["t1_ns"]))

    assert in_window("malloc_1m", "cuMemAlloc_v2", 1 << 20).height == 20
    drv = in_window("drv_64m", "cuMemAlloc_v2", 64 << 20)
    assert set(drv["ptr"]) == _ptrs(truth["drv_64m"]["ptrs"])
    host = in_window("host_8m", "cuMemHostAlloc", 8 << 20)
    assert host["ptr"].to_list() == [int(truth["host_8m"]["ptr"], 16)]
    man = in_window("managed", "cuMemAllocManaged", truth["managed"]["size"])
    assert man["ptr"].to_list() == [int(truth["managed"]["ptr"], 16)]
    asy = in_window("async", "cuMemAllocAsync", truth["async"]["size"])
    assert set(asy["ptr"]) == _ptrs(truth["async"]["ptrs"])
    vmm = truth["vmm"]
    steps = calls.filter(pl.col("ts_ns").is_between(vmm["t0_ns"], vmm["t1_ns"]))
    assert sorted(steps["func"]) == sorted(["cuMemCreate", "cuMemAddressReserve", "cuMemMap",
                                            "cuMemUnmap", "cuMemAddressFree", "cuMemRelease"])


def test_freed_pointers_have_their_free(truth: dict[str, Any], calls: pl.DataFrame) -> None:
    frees = calls.filter(pl.col("func") == "cuMemFree_v2")
    s = truth["malloc_1m"]
    freed = set(frees.filter(pl.col("ts_ns").is_between(s["t0_ns"], s["t1_ns"]))["ptr"])
    assert freed == _ptrs(s["freed_ptrs"]) and len(freed) == s["freed"] == 15
    assert not (set(frees["ptr"]) & _ptrs(s["leaked"]))
    asy = set(calls.filter(pl.col("func") == "cuMemFreeAsync")["ptr"])
    assert asy == _ptrs(truth["async"]["ptrs"])


def test_cpu_faults_on_managed_memory() -> None:
    """240 CPU faults (192 writes, 48 reads): the UVM tools counters on the same run agree."""
    f = open_trace(H200).scan("faults").collect()
    got = dict(f.group_by("access_type").len().rows())
    assert got == {"write": 192, "read": 48}
    assert set(f["source"]) == {"cpu"}
