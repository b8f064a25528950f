"""The trace directory: write, rotate, read back, permissions, crash safety."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gputrace import schema
from gputrace.errors import TraceError
from gputrace.trace.builder import MiB, TraceBuilder
from gputrace.trace.output import check_output
from gputrace.trace.reader import open_trace, trace_warnings
from gputrace.trace.writer import TraceWriter
from tests.conftest import FIXTURES


def _ioctl_rows(n: int, start: int = 0) -> pa.Table:
    b = TraceBuilder()
    for i in range(n):
        b.rm_alloc(float(start + i), 7, size=MiB)
    return pa.Table.from_pylist(b.rows["ioctls"], schema=schema.IOCTLS.arrow_schema)


def test_every_table_scans_empty_and_typed(tmp_path: Path) -> None:
    w = TraceWriter(tmp_path / "t")
    w.close()
    trace = open_trace(tmp_path / "t")
    for name, t in schema.TABLES.items():
        df = trace.scan(name).collect()
        assert df.height == 0
        assert df.schema == t.polars_schema


def test_round_trip_types_and_values(tmp_path: Path) -> None:
    w = TraceWriter(tmp_path / "t")
    w.append("ioctls", _ioctl_rows(3))
    w.close()
    df = open_trace(tmp_path / "t").scan("ioctls").collect()
    assert df.schema == schema.IOCTLS.polars_schema
    assert df["size_bytes"].to_list() == [MiB] * 3
    assert df["name"].to_list() == ["RM_ALLOC"] * 3
    assert df["device"].to_list() == ["ctl"] * 3


def test_rotation_writes_parts_and_manifest_counts(tmp_path: Path) -> None:
    w = TraceWriter(tmp_path / "t", rotate_rows=1_000_000)
    w.append("ioctls", _ioctl_rows(2))
    w.rotate()
    w.append("ioctls", _ioctl_rows(3, start=10))
    w.rotate()
    w.close()
    trace = open_trace(tmp_path / "t")
    assert [p.name for p in trace.parts("ioctls")] == ["part-000001.parquet", "part-000002.parquet"]
    assert trace.manifest["tables"]["ioctls"] == {"rows": 5, "parts": 2}
    assert trace.rows("ioctls") == 5
    assert trace.scan("ioctls").select(pl.len()).collect().item() == 5


def test_parts_carry_schema_version(tmp_path: Path) -> None:
    w = TraceWriter(tmp_path / "t")
    w.append("ioctls", _ioctl_rows(1))
    w.close()
    part = open_trace(tmp_path / "t").parts("ioctls")[0]
    md = pq.read_schema(part).metadata
    assert md[b"gputrace.schema_version"] == str(schema.SCHEMA_VERSION).encode()


def test_unfinished_writer_leaves_readable_recording_trace(tmp_path: Path) -> None:
    """What a SIGKILL leaves: rotated parts readable, status still 'recording'."""
    w = TraceWriter(tmp_path / "t")
    w.append("ioctls", _ioctl_rows(4))
    w.rotate()
    w.append("ioctls", _ioctl_rows(2, start=100))  # buffered, lost with the process
    trace = open_trace(tmp_path / "t")
    assert trace.status == "recording"
    assert trace.scan("ioctls").collect().height == 4


def test_private_permissions(tmp_path: Path) -> None:
    w = TraceWriter(tmp_path / "t")
    w.append("ioctls", _ioctl_rows(1))
    w.close()
    root = tmp_path / "t"
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    for p in [root / "manifest.json", *root.glob("*/*.parquet")]:
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p


def test_existing_output_needs_force(tmp_path: Path) -> None:
    TraceWriter(tmp_path / "t").close()
    with pytest.raises(TraceError, match="already exists"):
        TraceWriter(tmp_path / "t")
    TraceWriter(tmp_path / "t", force=True).close()


def test_force_refuses_to_clobber_non_trace(tmp_path: Path) -> None:
    d = tmp_path / "precious"
    d.mkdir()
    (d / "thesis.tex").write_text("x")
    with pytest.raises(TraceError, match="not a trace"):
        TraceWriter(d, force=True)
    assert (d / "thesis.tex").exists()


def test_append_rejects_wrong_columns(tmp_path: Path) -> None:
    w = TraceWriter(tmp_path / "t")
    with pytest.raises(TraceError, match="missing columns"):
        w.append("ioctls", pa.table({"ts_ns": [1]}))
    with pytest.raises(TraceError, match="unknown table"):
        w.append("nope", pa.table({"ts_ns": [1]}))


def test_manifest_is_json_with_format_fields(tmp_path: Path) -> None:
    w = TraceWriter(tmp_path / "t", manifest={"layers": ["syscall"]})
    w.close()
    m = json.loads((tmp_path / "t" / "manifest.json").read_text())
    assert m["format"] == "gputrace-trace"
    assert m["format_version"] == 1
    assert m["schema_version"] == schema.SCHEMA_VERSION
    assert m["status"] == "complete"
    assert m["layers"] == ["syscall"]
    assert not list((tmp_path / "t").glob("*.tmp"))


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o277, 0o777])
def test_private_permissions_under_any_umask(tmp_path: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        w = TraceWriter(tmp_path / "t")
        w.append("ioctls", _ioctl_rows(1))
        w.close()
    finally:
        os.umask(old)
    root = tmp_path / "t"
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert stat.S_IMODE((root / "ioctls").stat().st_mode) == 0o700
    for p in [root / "manifest.json", *root.glob("*/*.parquet")]:
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p


# ---------------------------------------------------------------- --force
def _snapshot(root: Path) -> dict[str, bytes | str]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


def test_force_leaves_a_foreign_manifest_directory_alone(tmp_path: Path) -> None:
    """A web app's folder: its own manifest.json, other json/parquet, table-named folders."""
    d = tmp_path / "webapp"
    (d / "ioctls").mkdir(parents=True)
    (d / "processes").mkdir()
    (d / "manifest.json").write_text(json.dumps({"name": "My App", "version": "1.0",
                                                 "manifest_version": 3}))
    (d / "settings.json").write_text("{}")
    (d / "data.parquet").write_bytes(b"PAR1 not ours PAR1")
    (d / "ioctls" / "part-000001.parquet").write_bytes(b"theirs")
    (d / "processes" / "notes.json").write_text("[]")
    before = _snapshot(d)
    for call in (lambda: check_output(d, force=True), lambda: TraceWriter(d, force=True)):
        with pytest.raises(TraceError, match="not a trace") as e:
            call()
        assert "\n" not in str(e.value) and "not a gputrace manifest" in str(e.value)
        assert _snapshot(d) == before


def test_force_deletes_only_what_the_manifest_lists(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    t = tmp_path / "t"
    w = TraceWriter(t)
    w.append("ioctls", _ioctl_rows(3))
    w.rotate()
    w.append("ioctls", _ioctl_rows(2, start=10))
    w.close()
    (t / "EXPECTED.json").write_text("{}")  # e.g. the fixtures' provenance files
    (t / "ioctls" / "README").write_text("mine")
    capsys.readouterr()
    w = TraceWriter(t, force=True)
    w.append("ioctls", _ioctl_rows(1, start=100))
    w.close()
    assert (t / "EXPECTED.json").read_text() == "{}"
    assert (t / "ioctls" / "README").read_text() == "mine"
    err = capsys.readouterr().err
    assert "kept 2 entries" in err and "EXPECTED.json" in err
    trace = open_trace(t)
    assert [p.name for p in trace.parts("ioctls")] == ["part-000001.parquet"]
    assert trace.scan("ioctls").collect()["ts_ns"].to_list() == [1_100_000_000_000]
    assert trace_warnings(trace) == []


def test_force_refuses_part_files_the_manifest_does_not_list(tmp_path: Path) -> None:
    t = tmp_path / "t"
    w = TraceWriter(t)
    w.append("ioctls", _ioctl_rows(3))
    w.close()
    stray = t / "ioctls" / "part-000007.parquet"
    stray.write_bytes((t / "ioctls" / "part-000001.parquet").read_bytes())
    (t / "faults").mkdir()
    (t / "faults" / "old.parquet").write_bytes(b"x")
    before = _snapshot(t)
    with pytest.raises(TraceError, match="not listed there; refusing, nothing deleted") as e:
        TraceWriter(t, force=True)
    assert "ioctls/part-000007.parquet" in str(e.value) and "faults/old.parquet" in str(e.value)
    assert _snapshot(t) == before


def test_force_replaces_a_killed_recording(tmp_path: Path) -> None:
    """Killed mid-rotation: one part renamed, one still .tmp, the manifest behind."""
    t = tmp_path / "t"
    w = TraceWriter(t)
    w.append("ioctls", _ioctl_rows(3))
    w.rotate()  # manifest: ioctls 1 part; status recording
    part = (t / "ioctls" / "part-000001.parquet").read_bytes()
    (t / "ioctls" / "part-000002.parquet").write_bytes(part)
    (t / "processes").mkdir()
    (t / "processes" / "part-000001.parquet.tmp").write_bytes(b"half")
    (t / "manifest.json.tmp").write_bytes(b"{")
    w._close_fds()  # killed: the kernel closes its descriptors, which releases its lock
    TraceWriter(t, force=True).close()
    assert sorted(str(p.relative_to(t)) for p in t.rglob("*")) == ["manifest.json"]


def test_force_refuses_a_manifest_with_unknown_tables(tmp_path: Path) -> None:
    t = tmp_path / "t"
    TraceWriter(t).close()
    m = json.loads((t / "manifest.json").read_text())
    m["tables"] = {"allocations": {"rows": 1, "parts": 1}}
    (t / "manifest.json").write_text(json.dumps(m))
    (t / "allocations").mkdir()
    (t / "allocations" / "part-000001.parquet").write_bytes(b"x")
    before = _snapshot(t)
    with pytest.raises(TraceError, match="unknown to this gputrace"):
        TraceWriter(t, force=True)
    assert _snapshot(t) == before


def test_force_reuses_an_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir(mode=0o755)
    check_output(tmp_path / "t", force=True)
    TraceWriter(tmp_path / "t", force=True).close()
    assert stat.S_IMODE((tmp_path / "t").stat().st_mode) == 0o700


def test_check_output_without_force(tmp_path: Path) -> None:
    check_output(tmp_path / "new")
    check_output(tmp_path / "a" / "b" / "new")
    assert not (tmp_path / "new").exists() and not (tmp_path / "a").exists()
    (tmp_path / "t").mkdir()
    with pytest.raises(TraceError, match="already exists"):
        check_output(tmp_path / "t")


# ---------------------------------------------------------------- integrity warnings
def test_missing_parts_warn_announced_versus_present(tmp_path: Path) -> None:
    t = tmp_path / "t"
    w = TraceWriter(t)
    w.append("ioctls", _ioctl_rows(4))
    w.rotate()
    w.append("ioctls", _ioctl_rows(3, start=10))
    w.close()
    assert trace_warnings(open_trace(t)) == []
    (t / "ioctls" / "part-000002.parquet").unlink()
    warnings = trace_warnings(open_trace(t))
    assert warnings == ["table ioctls: the manifest announces 7 rows in 2 parts, the trace holds "
                        "4 rows in 1 parts; results miss the absent rows"]


def test_announced_rows_that_never_were(tmp_path: Path) -> None:
    """1000 rows announced, 32 present: the issue's case."""
    t = tmp_path / "t"
    w = TraceWriter(t)
    w.append("ioctls", _ioctl_rows(32))
    w.close()
    m = json.loads((t / "manifest.json").read_text())
    m["tables"]["ioctls"]["rows"] = 1000
    m["tables"]["mappings"] = {"rows": 5, "parts": 1}
    (t / "manifest.json").write_text(json.dumps(m))
    w1, w2 = trace_warnings(open_trace(t))
    assert "table ioctls: the manifest announces 1000 rows in 1 parts, the trace holds 32" in w1
    assert "table mappings: the manifest announces 5 rows in 1 parts, the trace holds 0" in w2
    r = subprocess.run([sys.executable, "-m", "gputrace.cli", "info", str(t)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "warning: table ioctls: the manifest announces 1000" in r.stdout


def test_unfinished_recording_may_hold_one_rotation_more(tmp_path: Path) -> None:
    t = tmp_path / "t"
    w = TraceWriter(t)
    w.append("ioctls", _ioctl_rows(2))
    w.rotate()
    w.append("ioctls", _ioctl_rows(2, start=10))
    w._flush_table("ioctls")  # renamed, then killed before the manifest
    assert trace_warnings(open_trace(t)) == []
    w.close()


def test_rows_outside_the_time_span(tmp_path: Path) -> None:
    t = tmp_path / "t"
    start = 1_000_000_000_000
    w = TraceWriter(t, manifest={"start_ts_ns": start, "end_ts_ns": start + 5_000_000_000})
    w.append("ioctls", _ioctl_rows(3))  # 1 s apart from t=0: inside
    w.append("ioctls", _ioctl_rows(2, start=100))  # 100 s after the start: outside
    w.close()
    assert trace_warnings(open_trace(t)) == [
        f"table ioctls: 2 rows lie outside the trace's time span [{start}, {start + 5 * 10**9}] "
        "ns (manifest start_ts_ns/end_ts_ns); time-based results include them"
    ]


def test_committed_traces_have_no_integrity_warnings() -> None:
    dirs = [p.parent for p in sorted(FIXTURES.glob("**/manifest.json"))]
    real = Path("/work/shared/real-h200")
    dirs += [p.parent for p in sorted(real.glob("*/manifest.json"))] if real.is_dir() else []
    for d in dirs:
        assert trace_warnings(open_trace(d)) == [], d
