"""Recording of tests/standin/oom_scenario.py for the live tests (this module's
`record_oom_scenario`): the stand-in mounted with the scenario's budget, the
pre-existing holder started, `gputrace record` of the scenario, held until the trace
has the incident samples.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from gputrace.trace.reader import open_trace
from tests.record_helpers import RUN_S, RecorderProc, record_cmd, standin_driver_args


def record_oom_scenario(tmp_path: Path, extra: Sequence[str] = ()
                        ) -> tuple[Path, dict[str, Any]]:
    """Record tests/standin/oom_scenario.py on a mounted stand-in: (trace, its truth);
    `extra`: more `gputrace record` options (the flight recorder's).
    The scenario's processes hold their memory until the trace has the incident
    samples, so the holders are alive when the driver is asked. The truth is
    oom_scenario.run's (holders by pid, failures with the stand-in's free and largest
    free at that instant)."""
    from tests.standin import oom_scenario as sc
    from tests.standin.standin import mounted_driver

    out, expected, release = tmp_path / "trace", tmp_path / "expected.json", tmp_path / "go"
    with mounted_driver(tmp_path, budget=sc.BUDGET_MIB * sc.MIB, gpus=1) as dev:
        pre = sc.pre_holder(dev)
        try:
            rec = RecorderProc(record_cmd(
                out, "--device-dir", str(dev), *standin_driver_args(),
                "--pid-memory-interval", "200ms", *extra, "--",
                sys.executable, "-m", "tests.standin.oom_scenario", str(dev), str(expected),
                "--pre", str(pre.pid), "--release", str(release)))  # fmt: skip
            rec.wait_ready()
            _wait_incident_rows(out, expected, rec)
            release.touch()
            assert rec.wait(timeout=RUN_S) == 0, "".join(rec.stderr)
        finally:
            release.touch()
            pre.close()
    return out, json.loads(expected.read_text())


def _wait_incident_rows(out: Path, expected: Path, rec: RecorderProc) -> None:
    """Until the trace written so far holds an incident sample of the GPU and of its
    three holders (both failures may share one: they are a millisecond apart)."""
    deadline = time.monotonic() + RUN_S
    while time.monotonic() < deadline:
        assert rec.proc.poll() is None, "".join(rec.stderr)
        if expected.exists():
            try:
                t = open_trace(out)
                n = t.scan("gpu_memory").filter(pl.col("trigger") == "incident").collect().height
                m = t.scan("gpu_process_memory").filter(
                    pl.col("trigger") == "incident").collect().height
            except Exception:  # a part being renamed into place: read again
                n = m = 0
            if n >= 1 and m >= 3:
                return
        time.sleep(0.1)
    raise AssertionError("no incident samples in the trace in time")
