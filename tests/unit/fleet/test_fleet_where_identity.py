"""`fleet analyze --where` on the processes' container and pod identity: one exported
trace with two pods and a host process (planted bytes), one fleet run on one worker,
and an older exported trace without the columns, which no identity condition matches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gputrace.fleet import where
from gputrace.schema import PROCESSES
from gputrace.trace.builder import TraceBuilder
from tests.analyze_helpers import SCENARIO_DIR
from tests.cli_helpers import cli

MiB = 1 << 20
pytestmark = pytest.mark.xdist_group("fleet_analyze")


def test_job_fields_are_the_processes_columns() -> None:
    assert tuple(c.name for c in PROCESSES.columns) == where.JOB_FIELDS
    assert "pod_namespace" in where.JOB_FIELDS and "exit_code" in where._INT_FIELDS
    assert where.parse("pod_namespace = 'ml'") == ("cmp", "pod_namespace", "=", "ml")


def test_where_pod_namespace_keeps_that_namespace_s_processes(tmp_path: Path) -> None:
    b = TraceBuilder(("syscall",), duration_s=5.0)
    b.process(11, "train", pod_uid="6b1e4c1a-0d0f-4a55-9a5c-3f2b1d0e9c11",
              pod_namespace="ml", pod_name="trainer-0", qos_class="burstable")
    b.process(12, "eval", pod_uid="9f3a2b7c-5e1d-4c8b-8a0f-1d2c3b4a5e66",
              pod_namespace="ml", pod_name="eval-0", qos_class="besteffort")
    b.process(13, "web", pod_uid="11111111-2222-3333-4444-555555555555",
              pod_namespace="web", pod_name="front-0", qos_class="guaranteed")
    b.process(14, "host-job")
    for pid, size in ((11, 3 * MiB), (12, 5 * MiB), (13, 7 * MiB), (14, 11 * MiB)):
        b.rm_alloc(1.0, pid, size=size)
    trace = b.build(tmp_path / "pods")
    old = SCENARIO_DIR / "training_leak"  # recorded before the identity columns
    r = cli("export", str(trace), str(old), "--to", str(tmp_path / "ds"))
    assert r.returncode == 0, r.stderr
    r = cli("fleet", "analyze", str(tmp_path / "ds"), "--workers", "1", "-f", "json",
            "--where", "pod_namespace = 'ml' or pod_name ~ '^front'")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["traces"] == 1
    assert doc["leaks"]["total_bytes"] == 15 * MiB
    assert {j["comm"] for j in doc["leaks"]["top_jobs"]} == {"train", "eval", "web"}
