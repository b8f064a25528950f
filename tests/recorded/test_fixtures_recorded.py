"""Golden checks on traces recorded by real probes on the FUSE stand-in driver.

The fixtures come from `python3 fixtures/record_standin.py` (provenance in
each fixture's PROVENANCE.json and in fixtures/README.md). Each test asserts
the workload's known counts, read from the EXPECTED.json the workload printed
(`workload --print-expected ...`) beside the recording, and the analysis
output is kept as a golden file. They need no root and no GPU.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from gputrace.trace.reader import open_trace
from tests.analyze_helpers import GOLDEN, analyze
from tests.conftest import FIXTURES
from tests.goldens import DOCUMENT, check_text, json_parts, report_keys, stale_files

RM = FIXTURES / "standin-rm"
CUDA = FIXTURES / "standin-cuda"
FAULTS = FIXTURES / "standin-faults"
MEMORY_CLASSES = {0x40, 0x3E}
VIRTUAL_CLASSES = {0x50A0}
BLOCK = 2 << 20


def expected(fixture: Path = RM) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((fixture / "EXPECTED.json").read_text())
    return data


@pytest.mark.parametrize("fixture", [RM, CUDA, FAULTS], ids=lambda p: p.name)
def test_provenance_says_recorded(fixture: Path) -> None:
    prov = json.loads((fixture / "PROVENANCE.json").read_text())
    assert prov["recorded"] is True and prov["synthetic"] is False
    trace = open_trace(fixture)
    assert trace.status == "complete"
    assert not trace.manifest.get("synthetic")
    assert sum(trace.drops.values()) == 0
    assert "syscall" in trace.layers
    assert open_trace(fixture).scan("processes").collect()["exit_code"].to_list() == [0]


def test_ioctl_counts_per_device_and_command() -> None:
    df = open_trace(RM).scan("ioctls").collect()
    got = Counter(zip(df["device"].to_list(), df["name"].to_list(), strict=True))
    want = Counter({(dev, name): n for dev, names in expected()["ioctls_by_device"].items()
                    for name, n in names.items()})
    assert got == want
    assert df.height == expected()["ioctls_total"]
    assert df["pid"].n_unique() == 1


def test_memory_allocations_decoded() -> None:
    df = (open_trace(RM).scan("ioctls")
          .filter(pl.col("name").is_in(["RM_ALLOC", "RM_ALLOC_MEMORY"])
                  & pl.col("h_class").is_in([0x40, 0x3E, 0x50A0, 0x71]))
          .select("h_object", "h_class", "size_bytes", "status").collect())
    got = {r["h_object"]: (r["h_class"], r["size_bytes"], r["status"]) for r in df.to_dicts()}
    for a in expected()["memory_allocations"]:
        if a["ioctl"] in ("RM_ALLOC", "RM_ALLOC_MEMORY"):
            assert got[a["handle"]] == (a["class"], a["size"], a["status"]), a


def test_kept_objects_are_torn_down_by_the_last_close_of_nvidiactl() -> None:
    """--no-exit-free: the workload never frees its kept objects but closes its fds
    (nvidiactl twice: fd 3 and its dup) before exiting. The RM frees the client's
    tree at the last close, so nothing is leaked and the kept memory objects are
    reported as torn down by the fd release."""
    files = open_trace(RM).scan("files").collect()
    assert Counter(files["fd_op"].to_list()) == Counter(
        {"open": sum(expected()["opens"].values()), "close": 5, "dup": 1})
    leaks = analyze(RM, ["leaks"])["leaks"]
    assert leaks["allocations"] == []
    kept = [a for a in expected()["memory_allocations"]
            if a["fate"] == "kept" and a["ioctl"] == "RM_ALLOC"]
    mem = [a for a in kept if a["class"] in MEMORY_CLASSES]
    assert leaks["rm_freed_by_fd_close"] == {"count": len(mem),
                                             "bytes": sum(a["size"] for a in mem)}
    assert leaks["rm_virtual_unreleased"] == {"count": 0, "bytes": 0}
    assert leaks["bytes_by_layer"] == {"api": None, "rm": 0, "uvm": 0}


def test_api_calls_counts_sizes_and_results() -> None:
    """tests/standin_cuda/expected.json: every call, by symbol, size and result."""
    exp = expected(CUDA)
    df = open_trace(CUDA).scan("cuda_calls").collect()
    want = Counter()
    for calls in exp["calls_by_function"].values():
        want.update({sym: n for sym, n in calls.items() if sym.startswith("cuMem")
                     and sym not in ("cuMemGetAllocationGranularity", "cuMemSetAccess")})
    assert Counter(df["func"].to_list()) == want
    sizes = Counter((a["symbol"], a["size"], a["result"]) for a in exp["allocations"])
    got = Counter(zip(df["func"], df["size_bytes"], df["result"], strict=True))
    assert {k: got[k] for k in sizes} == dict(sizes)
    ioctl_pids = set(open_trace(CUDA).scan("ioctls").collect()["pid"].to_list())
    assert ioctl_pids == set(df["pid"].to_list())


def test_api_leaks_name_the_leaking_function() -> None:
    leaks = analyze(CUDA, ["leaks"])["leaks"]
    api = [a for a in leaks["allocations"] if a["layer"] == "api"]
    exp = expected(CUDA)["leaks"]
    assert len(api) == exp["count"] == 23
    assert sum(a["size_bytes"] for a in api) == exp["bytes"]
    (site,) = [s for s in leaks["by_stack"] if s["layer"] == "api"]
    assert site["count"] == 23 and site["frames"].startswith("leak_buffers < main")
    driver = expected(CUDA)["driver"]
    rm = [a for a in leaks["allocations"] if a["layer"] == "rm"]
    assert len(rm) == driver["leaked_vidmem_objects"]
    assert sum(a["size_bytes"] for a in rm) == driver["leaked_vidmem_bytes"]


def test_cpu_faults_match_the_touch_pattern() -> None:
    """fault_workload --print-expected: per page reads and writes, none outside ranges."""
    exp = expected(FAULTS)
    df = open_trace(FAULTS).scan("faults").collect()
    assert set(df["source"].to_list()) == {"cpu"}
    got = Counter(zip(df["address"].to_list(), df["access_type"].to_list(), strict=True))
    want: Counter[tuple[int, str]] = Counter()
    for p in exp["pages"]:
        want[(p["address"], "read")] += p["reads"]
        want[(p["address"], "write")] += p["writes"]
    assert got == +want
    assert (df["block_2m"] == df["address"] - df["address"] % BLOCK).all()
    # The fault-rate report's per-block counts are the pattern's.
    per_block: dict[int, list[int]] = {}
    for p in exp["pages"]:
        b = per_block.setdefault(p["address"] - p["address"] % BLOCK, [0, 0, 0])
        b[0] += p["reads"] + p["writes"]
        b[1] += p["reads"]
        b[2] += p["writes"]
    cpu = analyze(FAULTS, ["fault-rate"], top=100)["fault_rate"]["cpu_faults"]
    assert {r["block_2m"]: [r["faults"], r["reads"], r["writes"]]
            for r in cpu["top_blocks"]} == per_block
    assert (cpu["total"], cpu["reads"], cpu["writes"]) == (27, 10, 17)


_docs: dict[Path, dict[str, Any]] = {}


def _golden_dir(fixture: Path) -> Path:
    return GOLDEN / f"recorded_{fixture.name.replace('-', '_')}"


@pytest.mark.parametrize("part", [*report_keys(), DOCUMENT])
@pytest.mark.parametrize("fixture", [RM, CUDA, FAULTS], ids=lambda p: p.name)
def test_golden_report(fixture: Path, part: str, update_golden: bool) -> None:
    """Each report's JSON object, per recorded fixture, in a golden of its own."""
    if fixture not in _docs:
        _docs[fixture] = analyze(fixture)
    text = json.dumps(json_parts(_docs[fixture])[part], indent=2, sort_keys=True) + "\n"
    check_text(_golden_dir(fixture) / f"{part}.json", text, update_golden)


def test_no_golden_of_an_unregistered_report() -> None:
    for fixture in (RM, CUDA, FAULTS):
        assert stale_files(_golden_dir(fixture), [*report_keys(), DOCUMENT]) == [], fixture


def test_gpu_peak_equals_the_stand_in_drivers_own_peak() -> None:
    """Memory objects inherit their device's GPU (deviceId of the 0x80 alloc); the
    GPU-0 peak replayed from the trace equals the peak the FUSE driver counted."""
    dev = (open_trace(CUDA).scan("ioctls").filter(pl.col("h_class") == 0x80)
           .select("gpu_index").collect())
    assert dev["gpu_index"].to_list() == [0]
    gpus = analyze(CUDA, ["summary"])["summary"]["gpus"]
    assert gpus["source"] == "rm allocations"
    (g0,) = gpus["gpus"]
    assert (g0["gpu_index"], g0["peak_bytes"]) == (0, expected(CUDA)["driver"]["peak_vidmem_bytes"])
