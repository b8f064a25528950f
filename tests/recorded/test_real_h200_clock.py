"""A second real H200 recording of gpu_workload (fixtures/real-h200-driver-cuda-clock),
made after the UVM tools timestamps became a pure function of the raw time.

Independent truth: the driver's own counter tracker counts one GPU fault per serviced
fault, while the event stream writes that fault plus one record per merged duplicate with
the same timestamp; so distinct GPU fault times must equal the counter exactly. The
first recording (converted per drain) had 4 extra distinct times on the thrash run.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from gputrace.trace.reader import open_trace
from tests.cli_helpers import cli

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "real-h200-driver-cuda-clock"


def _counters() -> dict[str, int]:
    c = open_trace(FIX / "trace").scan("uvm_counters").collect()
    last = c.sort("ts_ns").group_by("counter").agg(pl.col("value").last())
    return dict(zip(last["counter"].to_list(), last["value"].to_list(), strict=True))


def test_distinct_gpu_fault_times_equal_the_driver_counter() -> None:
    f = open_trace(FIX / "trace").scan("faults").filter(pl.col("gpu_index").is_not_null())
    df = f.collect()
    assert _counters()["gpu_faults"] == 24_796
    assert df["ts_ns"].n_unique() == 24_796
    assert df.height == 32_223  # duplicates included


def test_tools_rows_name_the_process_and_nothing_is_called_missing() -> None:
    f = open_trace(FIX / "trace").scan("faults").select("comm").unique().collect()
    assert f["comm"].to_list() == ["gpu_workload"]
    m = json.loads((FIX / "trace" / "manifest.json").read_text())
    assert m["driver_layer"]["cpu_fault_source"]["uvm_pids_without_tracker"] == []
    r = cli("analyze", str(FIX / "trace"), "--only", "fault-rate", "--format", "json")
    assert r.returncode == 0, r.stderr
    warnings = json.loads(r.stdout)["fault_rate"]["warnings"]
    assert not any("CPU faults are missing" in w for w in warnings)


def test_api_truth_and_migrated_bytes_still_hold() -> None:
    r = cli("analyze", str(FIX / "trace"), "--only", "leaks", "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["leaks"]["total_bytes"] == 72_351_744
    c = _counters()
    assert (c["bytes_htod"], c["bytes_dtoh"], c["cpu_faults"]) == (67_108_864, 16_777_216, 240)
