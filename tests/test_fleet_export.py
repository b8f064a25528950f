"""`gputrace export`: the bundled fixtures (and copies renamed as other hosts) written as one
hive-partitioned dataset to a local folder and to an S3 server started here (moto, no
network); exporting twice changes nothing; bad input is one line."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from gputrace.builder import MiB, TraceBuilder
from tests.analyze_helpers import SCENARIO_DIR
from tests.conftest import FIXTURES
from tests.test_errors import assert_one_line_error, gputrace

SCENARIOS = ("training_leak", "exit_holding", "uvm_storm", "fragmented_gpu", "fault_rates")


def renamed(src: Path, dst: Path, host: str, **fields: Any) -> Path:
    """A copy of trace `src` as if recorded on `host` (a different recording)."""
    shutil.copytree(src, dst)
    m = json.loads((dst / "manifest.json").read_text())
    m["host"]["hostname"] = host
    m.update(fields)
    (dst / "manifest.json").write_text(json.dumps(m))
    return dst


def flagged_traces(root: Path) -> tuple[Path, Path]:
    """Synthetic: one trace with dropped events, one still `recording`."""
    out = []
    for name, drops, status in (("dropped", {"proc_events": 7}, "complete"),
                                ("unfinished", {}, "recording")):
        b = TraceBuilder(("syscall", "api"), drops=drops, status=status, duration_s=3.0)
        b.process(500, "job", cmdline="python job.py --epochs 3")
        b.cuda_alloc(t=1.0, pid=500, size=MiB)
        out.append(b.build(root / name))
    return out[0], out[1]


def fleet_traces(root: Path) -> list[Path]:
    """The fleet of the tests: default + scenarios as host `synthetic`, default and two
    scenarios again as hosts h1 and h2 (one of them on another driver), and the flagged
    pair as host `flaky`."""
    out = [FIXTURES / "default", *(SCENARIO_DIR / s for s in SCENARIOS)]
    out.append(renamed(FIXTURES / "default", root / "h1-default", "h1"))
    out.append(renamed(SCENARIO_DIR / "training_leak", root / "h1-leak", "h1"))
    out.append(renamed(SCENARIO_DIR / "fault_rates", root / "h2-faults", "h2",
                       driver_version="575.57.08"))
    for t in flagged_traces(root):
        out.append(renamed(t, root / f"flaky-{t.name}", "flaky"))
    return out


def snapshot(root: Path) -> dict[str, tuple[str, int]]:
    return {str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(),
                                       p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_local_export_is_partitioned_and_listed(tmp_path: Path) -> None:
    traces = fleet_traces(tmp_path / "src")
    dest = tmp_path / "ds"
    r = gputrace("export", *map(str, traces), "--to", str(dest))
    assert r.returncode == 0, r.stderr
    assert f"{len(traces)} exported, 0 replaced" in r.stdout
    index = json.loads((dest / "manifest.json").read_text())
    assert index["format"] == "gputrace-fleet" and index["partitioning"] == ["date", "host"]
    entries = list(index["traces"].values())
    assert len(entries) == len(traces)
    assert sorted({e["host"] for e in entries}) == ["flaky", "h1", "h2", "synthetic"]
    assert {e["status"] for e in entries if e["host"] == "flaky"} == {"complete", "recording"}
    assert [e["drops"] for e in entries if e["host"] == "flaky" and e["drops"]] == [
        {"proc_events": 7}]
    assert all(e["date"] == "2026-01-01" for e in entries)  # builder's realtime offset
    # hive layout: date= then host=, one file per trace named by its id
    files = sorted(p.relative_to(dest).parts[:3] for p in dest.glob("cuda_calls/*/*/*.parquet"))
    assert ("cuda_calls", "date=2026-01-01", "host=h1") in files
    scan = pl.scan_parquet(str(dest / "cuda_calls" / "**" / "*.parquet"), hive_partitioning=True)
    df = scan.collect()
    assert {"host", "date", "trace_id", "driver_version", "gpu_model"} <= set(df.columns)
    h2 = df.filter(pl.col("host") == "h2")
    assert h2.is_empty() or set(h2["driver_version"]) == {"575.57.08"}
    # the rows exported are the trace's rows
    leak = next(e for e in entries if e["source"] == str(SCENARIO_DIR / "training_leak"))
    ours = df.filter(pl.col("trace_id") == leak["trace_id"]).drop(
        "host", "date", "trace_id", "driver_version", "gpu_model")
    orig = pl.read_parquet(str(SCENARIO_DIR / "training_leak" / "cuda_calls" / "*.parquet"))
    assert ours.height == orig.height and ours.equals(orig.select(ours.columns))


def test_exporting_twice_changes_nothing_and_a_changed_trace_is_replaced(tmp_path: Path
                                                                          ) -> None:
    traces = fleet_traces(tmp_path / "src")
    dest = tmp_path / "ds"
    assert gputrace("export", *map(str, traces), "--to", str(dest)).returncode == 0
    before = snapshot(dest)
    r = gputrace("export", *map(str, traces), "--to", str(dest))
    assert r.returncode == 0, r.stderr
    assert f"0 exported, 0 replaced (changed since last export), {len(traces)} unchanged" \
        in r.stdout
    assert snapshot(dest) == before
    # the unfinished recording completes: same identity, replaced, not duplicated
    unfinished = tmp_path / "src" / "flaky-unfinished"
    m = json.loads((unfinished / "manifest.json").read_text())
    m["status"] = "complete"
    (unfinished / "manifest.json").write_text(json.dumps(m))
    r = gputrace("export", str(unfinished), "--to", str(dest))
    assert "0 exported, 1 replaced" in r.stdout, r.stdout + r.stderr
    index = json.loads((dest / "manifest.json").read_text())
    assert len(index["traces"]) == len(traces)
    assert "recording" not in {e["status"] for e in index["traces"].values()}


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    """An S3-compatible server on localhost (moto's server mode) with bucket `fleet`."""
    moto_server = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    boto3.client("s3", endpoint_url=url).create_bucket(Bucket="fleet")
    try:
        yield url
    finally:
        server.stop()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_export_to_s3_then_fleet_analyze_matches_local(tmp_path: Path, s3: str) -> None:
    traces = [str(t) for t in fleet_traces(tmp_path / "src")]
    opt = ["--storage-option", f"endpoint_url={s3}"]
    r = gputrace("export", *traces, "--to", "s3://fleet/ds", *opt)
    assert r.returncode == 0, r.stderr
    r = gputrace("export", *traces, "--to", "s3://fleet/ds", *opt)
    assert f"{len(traces)} unchanged" in r.stdout, r.stdout + r.stderr
    assert gputrace("export", *traces, "--to", str(tmp_path / "ds")).returncode == 0
    remote = gputrace("fleet", "analyze", "s3://fleet/ds", *opt, "--workers", "2", "-f", "json")
    local = gputrace("fleet", "analyze", str(tmp_path / "ds"), "--workers", "2", "-f", "json")
    assert remote.returncode == 0 and local.returncode == 0, remote.stderr + local.stderr
    a, b = json.loads(remote.stdout), json.loads(local.stdout)
    assert a["engine"]["workers"] == 2
    for d in (a, b):
        d.pop("dataset"), d.pop("engine")
        for row in d["trace_list"]:
            row.pop("source", None)
    assert a == b and a["traces"] == len(traces)


@pytest.mark.parametrize(("args", "needle"), [
    (["export", "/nonexistent/trace", "--to", "DEST"], "no such trace directory"),
    (["export", str(FIXTURES / "default"), "--to", " "], "--to: empty destination"),
    (["export", str(FIXTURES / "default"), "--to", "DEST", "--storage-option", "novalue"],
     "expected KEY=VALUE"),
    (["fleet", "analyze", str(FIXTURES / "default")], "is not a gputrace dataset"),
    (["fleet", "analyze", "/nonexistent/ds"], "is not a gputrace dataset"),
])
def test_bad_input_is_one_line(tmp_path: Path, args: list[str], needle: str) -> None:
    args = [str(tmp_path / "ds") if a == "DEST" else a for a in args]
    assert_one_line_error(gputrace(*args), needle)


def test_bad_dataset_manifest_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "manifest.json").write_text("{not json")
    assert_one_line_error(gputrace("fleet", "analyze", str(tmp_path / "ds")), "unreadable JSON")
    (tmp_path / "ds" / "manifest.json").write_text('{"format": "gputrace-fleet", '
                                                   '"format_version": 99, "traces": {}}')
    assert_one_line_error(gputrace("fleet", "analyze", str(tmp_path / "ds")),
                          "dataset format 99")
