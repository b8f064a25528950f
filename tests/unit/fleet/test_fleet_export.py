"""`gputrace export`: the bundled fixtures (and copies renamed as other hosts) written as one
hive-partitioned dataset to a local folder and to an S3 server started here (moto, no
network); exporting twice changes nothing; bad input is one line. A dataset is untrusted
input too: an index naming paths outside it (`..`, absolute, links out, odd S3 keys), a
trace id taken over by another recording and a newer schema are refused with one line,
and nothing is deleted."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from gputrace import schema
from gputrace.fleet.store import DatasetError, Store
from gputrace.trace.builder import MiB, TraceBuilder
from tests.analyze_helpers import SCENARIO_DIR
from tests.cli_helpers import cli
from tests.conftest import FIXTURES
from tests.unit.commands.test_errors import assert_one_line_error, gputrace

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
    r = cli("export", *map(str, traces), "--to", str(dest))
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
    assert cli("export", *map(str, traces), "--to", str(dest)).returncode == 0
    before = snapshot(dest)
    r = cli("export", *map(str, traces), "--to", str(dest))
    assert r.returncode == 0, r.stderr
    assert f"0 exported, 0 replaced (changed since last export), {len(traces)} unchanged" \
        in r.stdout
    assert snapshot(dest) == before
    # the unfinished recording completes: same identity, replaced, not duplicated
    unfinished = tmp_path / "src" / "flaky-unfinished"
    m = json.loads((unfinished / "manifest.json").read_text())
    m["status"] = "complete"
    (unfinished / "manifest.json").write_text(json.dumps(m))
    r = cli("export", str(unfinished), "--to", str(dest))
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
    assert cli("export", *traces, "--to", str(tmp_path / "ds")).returncode == 0
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


# --- a hostile dataset ---------------------------------------------------------------

DEFAULT = FIXTURES / "default"


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default fixture exported once; tests work on copies of it."""
    ds = tmp_path_factory.mktemp("exported") / "ds"
    r = cli("export", str(DEFAULT), "--to", str(ds))
    assert r.returncode == 0, r.stderr
    return ds


def dataset(exported: Path, tmp_path: Path) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """A copy of the exported dataset under tmp_path, its index and its one entry."""
    ds = tmp_path / "ds"
    shutil.copytree(exported, ds, symlinks=True)
    index = json.loads((ds / "manifest.json").read_text())
    (entry,) = index["traces"].values()
    return ds, index, entry


def write_index(ds: Path, index: dict[str, Any]) -> None:
    (ds / "manifest.json").write_text(json.dumps(index))


@pytest.mark.parametrize("bad", ["../victim.txt", "ioctls/../../victim.txt", "VICTIM",
                                 "ioctls//victim.txt", "./victim.txt", ["x"]])
def test_export_never_deletes_what_the_index_names_outside_the_dataset(
        exported: Path, tmp_path: Path, bad: Any) -> None:
    """Guards: a re-export removes the stale files an index lists; one listing `../x`, an
    absolute path or another odd key must be refused before anything is deleted or
    written (it used to delete the file outside the dataset)."""
    ds, index, entry = dataset(exported, tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    bad = str(victim) if bad == "VICTIM" else bad
    entry["files"]["faults"] = bad
    entry["fingerprint"] = "changed"  # so the export replaces the trace and removes stale files
    write_index(ds, index)
    before = snapshot(ds)
    r = cli("export", str(DEFAULT), "--to", str(ds))
    assert_one_line_error(r, f"trace {entry['trace_id']!r}: file")
    assert victim.read_text() == "keep me"
    assert snapshot(ds) == before


@pytest.mark.parametrize("record", ["../outside.json", "OUTSIDE", "traces/../../outside.json",
                                    "../../../../etc/hostname", "traces/other.json"])
def test_fleet_analyze_reads_no_record_the_index_names_outside_the_dataset(
        exported: Path, tmp_path: Path, record: str) -> None:
    """Guards: `fleet analyze` opens each trace's record at the index's word; a record
    path outside the dataset (or not the trace's own) is one line, never read (it used
    to report on whatever file it named)."""
    ds, index, entry = dataset(exported, tmp_path)
    outside = tmp_path / "outside.json"
    shutil.copy(ds / entry["record"], outside)
    entry["record"] = str(outside) if record == "OUTSIDE" else record
    write_index(ds, index)
    assert_one_line_error(gputrace("fleet", "analyze", str(ds)), f"record {entry['record']!r}")


def test_fleet_analyze_reads_no_table_file_a_record_names_outside(exported: Path,
                                                                  tmp_path: Path) -> None:
    """Guards: the table files come from the trace record, not the index; they are checked
    the same way (a record naming `../x.parquet` is one line, the file is not read)."""
    ds, _, entry = dataset(exported, tmp_path)
    rec_path = ds / entry["record"]
    rec = json.loads(rec_path.read_text())
    shutil.copy(ds / rec["files"]["ioctls"], tmp_path / "outside.parquet")
    rec["files"]["ioctls"] = "../outside.parquet"
    rec_path.write_text(json.dumps(rec))
    r = gputrace("fleet", "analyze", str(ds), "--workers", "1")
    assert_one_line_error(r, "file '../outside.parquet'")


def test_fleet_analyze_follows_no_link_out_of_a_local_dataset(exported: Path,
                                                              tmp_path: Path) -> None:
    """Guards: a record that is a symbolic link to a file outside the dataset is refused
    (the check resolves links), though its name is the expected `traces/<id>.json`."""
    ds, _, entry = dataset(exported, tmp_path)
    outside = tmp_path / "outside.json"
    shutil.move(ds / entry["record"], outside)
    (ds / entry["record"]).symlink_to(outside)
    r = gputrace("fleet", "analyze", str(ds), "--workers", "1")
    assert_one_line_error(r, "a link leads out of the dataset")


def test_export_deletes_nothing_behind_a_link_out_of_a_local_dataset(exported: Path,
                                                                     tmp_path: Path) -> None:
    """Guards: a stale file whose table folder is a link out of the dataset is not
    removed (it used to be: the path was joined and deleted unchecked); the export stops
    with one line before writing anything."""
    ds, index, entry = dataset(exported, tmp_path)
    tid = entry["trace_id"]
    (table,) = [n for n in sorted(schema.TABLES) if n not in entry["files"]][:1]
    rel = f"{table}/date=2026-01-01/host=h/{tid}.parquet"
    victim = tmp_path / "elsewhere" / "date=2026-01-01" / "host=h" / f"{tid}.parquet"
    victim.parent.mkdir(parents=True)
    victim.write_bytes(b"keep me")
    (ds / table).symlink_to(tmp_path / "elsewhere")
    entry["files"][table] = rel
    entry["fingerprint"] = "changed"
    write_index(ds, index)
    before = snapshot(ds)
    assert_one_line_error(cli("export", str(DEFAULT), "--to", str(ds)),
                          "a link leads out of the dataset")
    assert victim.read_bytes() == b"keep me"
    assert snapshot(ds) == before


@pytest.mark.parametrize("key", ["../x", "/x", "a//b", "a/./b", "a/", "", "a/\x00b", "a/\x1bb"])
def test_store_paths_stay_inside_an_object_store_prefix(key: str) -> None:
    """Guards: the one gate every dataset path passes (`Store.path`) refuses keys that
    leave the prefix or alias another key on S3, where no link resolution can help."""
    pytest.importorskip("s3fs")
    store = Store("s3://fleet/ds", {"anon": True})
    assert store.path("traces/t1.json") == "fleet/ds/traces/t1.json"
    with pytest.raises(DatasetError, match="not a path inside the dataset"):
        store.path(key)


def test_s3_export_deletes_nothing_outside_its_prefix(tmp_path: Path, s3: str) -> None:
    """Guards: the s3:// variant of the stale-file deletion (key `../victim.txt` next to
    the dataset's prefix): refused with one line, the object is still there."""
    boto3 = pytest.importorskip("boto3")
    client = boto3.client("s3", endpoint_url=s3)
    opt = ["--storage-option", f"endpoint_url={s3}"]
    assert gputrace("export", str(DEFAULT), "--to", "s3://fleet/hostile", *opt).returncode == 0
    client.put_object(Bucket="fleet", Key="victim.txt", Body=b"keep me")
    index = json.loads(client.get_object(Bucket="fleet", Key="hostile/manifest.json")
                       ["Body"].read())
    (entry,) = index["traces"].values()
    entry["files"]["faults"] = "../victim.txt"
    entry["fingerprint"] = "changed"
    client.put_object(Bucket="fleet", Key="hostile/manifest.json", Body=json.dumps(index))
    r = gputrace("export", str(DEFAULT), "--to", "s3://fleet/hostile", *opt)
    assert_one_line_error(r, "file '../victim.txt'")
    assert client.get_object(Bucket="fleet", Key="victim.txt")["Body"].read() == b"keep me"


def test_another_recording_with_the_same_trace_id_is_refused(tmp_path: Path) -> None:
    """Guards: a second trace carrying a trace_id already in the dataset used to replace
    it silently (the first host's files deleted, fleet totals lower). It is refused with
    one line naming both; the dataset is unchanged."""
    tid = "0b7a3c1e-0000-4000-8000-000000000001"
    first = renamed(DEFAULT, tmp_path / "first", "h1", trace_id=tid)
    second = renamed(DEFAULT, tmp_path / "second", "h2", trace_id=tid)
    ds = tmp_path / "ds"
    assert cli("export", str(first), "--to", str(ds)).returncode == 0
    before = snapshot(ds)
    r = cli("export", str(second), "--to", str(ds))
    assert_one_line_error(r, f"{second}: trace_id {tid} already names another recording")
    assert str(first) in r.stderr and "'h1'" in r.stderr
    assert snapshot(ds) == before
    # in one command: the first is kept, the second refused
    r = cli("export", str(first), str(second), "--to", str(tmp_path / "both"))
    assert_one_line_error(r, f"{second}: trace_id {tid}")
    index = json.loads((tmp_path / "both" / "manifest.json").read_text())
    assert [e["host"] for e in index["traces"].values()] == ["h1"]


def test_the_same_recording_with_its_trace_id_is_still_replaced(tmp_path: Path) -> None:
    """Guards the other side of the refusal: the same recording (same host, start,
    creation time, recorder) exported while `recording` and again once `complete` under
    its manifest's trace_id replaces its earlier export, as before."""
    tid = "0b7a3c1e-0000-4000-8000-000000000002"
    t = renamed(DEFAULT, tmp_path / "t", "h1", trace_id=tid, status="recording")
    ds = tmp_path / "ds"
    assert cli("export", str(t), "--to", str(ds)).returncode == 0
    m = json.loads((t / "manifest.json").read_text())
    m["status"] = "complete"
    (t / "manifest.json").write_text(json.dumps(m))
    r = cli("export", str(t), "--to", str(ds))
    assert "0 exported, 1 replaced" in r.stdout, r.stdout + r.stderr
    index = json.loads((ds / "manifest.json").read_text())
    assert [(e["trace_id"], e["status"]) for e in index["traces"].values()] == [
        (tid, "complete")]


def test_a_dataset_of_a_newer_schema_is_refused(exported: Path, tmp_path: Path) -> None:
    """Guards: `fleet analyze` (and `export`) on a dataset written with a newer table
    schema used to read it silently as this version's; now one line says so."""
    ds, index, _ = dataset(exported, tmp_path)
    newer = schema.SCHEMA_VERSION + 1
    index["schema_version"] = newer
    write_index(ds, index)
    before = snapshot(ds)
    needle = (f"dataset written by a newer gputrace (schema version {newer} > supported "
              f"{schema.SCHEMA_VERSION})")
    assert_one_line_error(gputrace("fleet", "analyze", str(ds)), needle)
    t = renamed(DEFAULT, tmp_path / "t", "h9")
    assert_one_line_error(cli("export", str(t), "--to", str(ds)), needle)
    assert snapshot(ds) == before


def test_errors_stay_one_line_when_the_dask_http_port_is_busy(exported: Path,
                                                              tmp_path: Path) -> None:
    """Guards: the local cluster's scheduler used to put its HTTP server on port 8787 and
    warn on stderr when that was taken (another Dask, a notebook), so a worker's error was
    no longer one line."""
    ds, _, entry = dataset(exported, tmp_path)
    (ds / entry["record"]).write_text("[]")
    with socket.socket() as busy:
        try:
            busy.bind(("127.0.0.1", 8787))
            busy.listen()
        except OSError:
            pass  # taken already, which is the case under test
        r = gputrace("fleet", "analyze", str(ds), "--workers", "1")
    assert_one_line_error(r, "not a trace record")
