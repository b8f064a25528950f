"""The trace directory: write, rotate, read back, permissions, crash safety."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gputrace import schema
from gputrace.builder import MiB, TraceBuilder
from gputrace.errors import TraceError
from gputrace.tracedir import TraceWriter, open_trace


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
