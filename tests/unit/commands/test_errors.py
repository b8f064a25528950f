"""Bad input gives one line on stderr and a non-zero exit, never a traceback.

Each test damages a copy of the bundled default trace in one way. Most run the command
in the test's process (`tests.cli_helpers.cli`); those where the process itself could
hang (a FIFO) or crash (pages decoded by C++) run it as a subprocess (`gputrace`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.cli_helpers import cli
from tests.conftest import FIXTURES

DEFAULT = FIXTURES / "default"


def gputrace(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gputrace.cli", *args], capture_output=True, text=True, timeout=120
    )


def assert_one_line_error(r: subprocess.CompletedProcess[str], needle: str) -> None:
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("gputrace: error: "), r.stderr
    assert needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    dst = tmp_path / "trace"
    shutil.copytree(DEFAULT, dst)
    return dst


def test_missing_path(tmp_path: Path) -> None:
    assert_one_line_error(cli("info", str(tmp_path / "nope")), "no such trace")


def test_not_a_trace(tmp_path: Path) -> None:
    assert_one_line_error(cli("info", str(tmp_path)), "not a gputrace trace")


def test_a_file_not_a_directory(tmp_path: Path) -> None:
    f = tmp_path / "f.parquet"
    f.write_bytes(b"PAR1")
    assert_one_line_error(cli("info", str(f)), "not a trace directory")


def test_garbage_manifest(copy: Path) -> None:
    (copy / "manifest.json").write_text("{ not json")
    assert_one_line_error(cli("info", str(copy)), "unreadable manifest")


def test_newer_format(copy: Path) -> None:
    m = json.loads((copy / "manifest.json").read_text())
    m["format_version"] = 99
    (copy / "manifest.json").write_text(json.dumps(m))
    assert_one_line_error(cli("info", str(copy)), "newer than this gputrace")


def test_truncated_part(copy: Path) -> None:
    part = next((copy / "ioctls").glob("part-*.parquet"))
    data = part.read_bytes()
    part.write_bytes(data[: len(data) // 2])
    r = cli("info", str(copy))
    assert_one_line_error(r, "corrupt Parquet part")
    assert "ioctls" in r.stderr


def test_empty_part(copy: Path) -> None:
    part = next((copy / "cuda_calls").glob("part-*.parquet"))
    part.write_bytes(b"")
    assert_one_line_error(cli("dump", str(copy), "cuda_calls"), "corrupt Parquet part")


def test_corrupt_data_pages_with_intact_footer(copy: Path) -> None:
    """Footer checks pass; the damage shows only when pages are decoded."""
    part = next((copy / "ioctls").glob("part-*.parquet"))
    data = bytearray(part.read_bytes())
    for i in range(8, min(len(data) // 2, 4000)):
        data[i] = 0xFF
    part.write_bytes(bytes(data))
    r = gputrace("dump", str(copy), "ioctls")
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.startswith("gputrace: error: ")


def test_unknown_table(copy: Path) -> None:
    assert_one_line_error(cli("dump", str(copy), "allocations"), "unknown table")


def test_bad_format_option(copy: Path) -> None:
    r = cli("dump", str(copy), "ioctls", "--format", "xml")
    assert_one_line_error(r, "--format")


def test_damage_leaves_the_original_untouched(copy: Path) -> None:
    """Reading never writes: nothing already recorded is lost."""
    before = {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    cli("info", str(copy))
    cli("dump", str(copy), "ioctls", "--format", "csv")
    after = {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    assert before == after


def test_unknown_option_is_a_usage_error_not_a_traceback(copy: Path) -> None:
    r = cli("dump", str(copy), "ioctls", "--nope")
    assert r.returncode == 2
    assert "No such option" in r.stderr and "Traceback" not in r.stderr


# ---------------------------------------------------------------- damaged parts
# Each rewrites one Parquet part of the copy by hand (hand-made damage of a
# synthetic fixture) and expects one line naming the part, table and column.


def rewrite_part(part: Path, change: Callable[[pa.Table], pa.Table], **kw: Any) -> None:
    pq.write_table(change(pq.read_table(part)), part, **kw)


def with_column(t: pa.Table, name: str, values: pa.Array[Any]) -> pa.Table:
    i = t.schema.get_field_index(name)
    return t.set_column(i, pa.field(name, values.type, nullable=True), values)


def test_schema_version_metadata_not_a_number(copy: Path) -> None:
    part = next((copy / "ioctls").glob("part-*.parquet"))
    rewrite_part(part, lambda t: t.replace_schema_metadata({b"gputrace.schema_version": b"two"}))
    r = cli("info", str(copy))
    assert_one_line_error(r, "schema version metadata")
    assert "ioctls" in r.stderr and "not a number" in r.stderr


@pytest.mark.parametrize("statistics", [True, False], ids=["footer-stats", "no-stats"])
def test_null_in_a_never_null_column(copy: Path, statistics: bool) -> None:
    part = next((copy / "chunks").glob("part-*.parquet"))

    def null_gpu(t: pa.Table) -> pa.Table:
        values = t.column("gpu_index").to_pylist()
        return with_column(t, "gpu_index", pa.array([None, *values[1:]], pa.int16()))

    rewrite_part(part, null_gpu, write_statistics=statistics)
    r = cli("analyze", str(copy))
    assert_one_line_error(r, "table chunks column gpu_index has 1 null values")


def test_name_stored_as_integers(copy: Path) -> None:
    """Cast to text, integers would silently match no RM command: an error instead."""
    part = next((copy / "ioctls").glob("part-*.parquet"))
    rewrite_part(part, lambda t: with_column(t, "name", pa.array(range(t.num_rows), pa.int64())))
    r = cli("analyze", str(copy), "--only", "leaks")
    assert_one_line_error(r, "table ioctls column name is stored as int64, expected string")


def test_part_that_is_a_fifo_is_not_read(copy: Path) -> None:
    """A FIFO named like a part would block the reader forever; it is not a part."""
    fifo = copy / "ioctls" / "part-000009.parquet"
    os.mkfifo(fifo)
    r = gputrace("info", str(copy))
    assert r.returncode == 0, r.stderr


def test_manifest_that_is_a_fifo(copy: Path) -> None:
    (copy / "manifest.json").unlink()
    os.mkfifo(copy / "manifest.json")
    assert_one_line_error(gputrace("info", str(copy)), "not a regular file")


def test_end_before_start(copy: Path) -> None:
    m = json.loads((copy / "manifest.json").read_text())
    m["end_ts_ns"] = m["start_ts_ns"] - 1
    (copy / "manifest.json").write_text(json.dumps(m))
    for cmd in (["info"], ["analyze"]):
        assert_one_line_error(cli(*cmd, str(copy)), "'end_ts_ns'")
