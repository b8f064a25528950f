"""Live: the recorder samples the GPU at the instant of an out-of-memory failure.
On the FUSE stand-in (first-fit heap, tests/standin/oom_scenario.py) three processes
hold known bytes, one of them started before the recording; one asks for more than
the free memory (capacity), another, after planted fragmentation, for less than the
free memory but more than the largest free region. The RM_ALLOC failures wake the RM
sampler: `gpu_memory` rows marked `incident` hold the stand-in's own free and largest
free at that instant, with the delay since the failed call returned, and
`gpu_process_memory` rows hold every holder's exact bytes, the untraced one too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from gputrace.trace.reader import open_trace
from tests.record_helpers import live_skip_reason
from tests.standin.oom_record import record_oom_scenario

pytestmark = [pytest.mark.live]
_SKIP = live_skip_reason()
if _SKIP is not None:
    pytestmark.append(pytest.mark.skip(reason=_SKIP))

DELAY_BOUND_NS = 2_000_000_000
"""A deadline for a loaded 2-core host, not the target: the sample follows the probe's
wakeup (about half a millisecond here); benchmarks/oom_delay measures the delay."""


def test_incident_samples_hold_the_instant_and_every_holder(tmp_path: Path) -> None:
    out, truth = record_oom_scenario(tmp_path)
    t = open_trace(out)
    assert "rm_query" in t.manifest["layers"]
    gm = t.scan("gpu_memory").sort("ts_ns").collect()
    inc = gm.filter(pl.col("trigger") == "incident")
    failures = truth["failures"]
    assert isinstance(failures, list)
    # one incident sample per GPU for the failures decoded together: two when the
    # recorder's batches split the two failures (a millisecond apart), else one
    assert 1 <= inc.height <= 2
    ticks = gm.filter(pl.col("trigger") == "tick")
    assert ticks.height > 0 and ticks["delay_ns"].null_count() == ticks.height
    ioctls = t.scan("ioctls").filter((pl.col("name") == "RM_ALLOC") & (pl.col("status") == 0x51))
    fails = ioctls.sort("ts_ns").collect()
    assert fails["pid"].to_list() == [f["pid"] for f in failures]
    assert fails["size_bytes"].to_list() == [f["requested_bytes"] for f in failures]
    for row in inc.iter_rows(named=True):
        # the planted heap: free 384 MiB, largest free 128 MiB, both failures met it
        f = failures[0]
        assert (row["heap_size_bytes"], row["heap_free_bytes"], row["largest_free_bytes"]) == (
            truth["heap_size_bytes"], f["heap_free_bytes"], f["largest_free_bytes"])
        assert row["status"] == 0 and row["gpu_index"] == truth["gpu_index"]
        # delay from the failed call's return, as recorded in the ioctl row
        ends = [s + lat for s, lat in zip(fails["ts_ns"], fails["latency_ns"], strict=True)]
        assert row["ts_ns"] - row["delay_ns"] in ends
        assert 0 < row["delay_ns"] < DELAY_BOUND_NS
    pm = t.scan("gpu_process_memory").collect()
    holders = {int(k): v["bytes"] for k, v in truth["holders"].items()}  # type: ignore[union-attr]
    assert len(holders) == 3
    rows = pm.filter(pl.col("trigger") == "incident")
    first = rows.filter(pl.col("ts_ns") == rows["ts_ns"].min())
    assert dict(zip(first["pid"], first["vidmem_bytes"], strict=True)) == holders
    assert set(pm["status"]) == {0}
    # the pre-existing holder is not a traced process, yet the driver names it, from
    # the first periodic sample on (before the scenario's processes existed)
    pre = next(int(k) for k, v in truth["holders"].items() if not v["traced"])  # type: ignore[union-attr]
    ticks = pm.filter(pl.col("trigger") == "tick")
    first = ticks.filter(pl.col("ts_ns") == ticks["ts_ns"].min())
    assert dict(zip(first["pid"], first["vidmem_bytes"], strict=True)) == {pre: holders[pre]}
    assert pre not in set(t.scan("ioctls").select("pid").collect()["pid"])
    # both failures were heard from the probe's own record, before decoding
    assert t.manifest["oom_watch"] == {"open": True, "error": None, "failures": 2, "early": 2}
    dl = t.manifest["driver_layer"]
    assert dl["pid_sample_interval_ms"] == 200.0
    assert dl["rm_client"]["incident_samples"] == inc.height
    info = subprocess.run([sys.executable, "-m", "gputrace.cli", "info", str(out)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert info.returncode == 0, info.stderr
    assert f"{dl['rm_client']['incident_samples']} incident samples" in info.stdout
