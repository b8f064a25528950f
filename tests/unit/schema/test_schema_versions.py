"""The schema version is derived from the columns: each declares the version that added
it (`Column.since`), the schema's version is the newest, and a part of an older version
may lack exactly the nullable columns added since (read as nulls); a part of the
column's version or newer without it is refused."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from gputrace import schema
from gputrace.errors import TraceError
from gputrace.schema.model import I32, Column, Table, schema_version
from gputrace.trace.builder import TraceBuilder
from gputrace.trace.reader import open_trace


def test_version_is_the_newest_since() -> None:
    assert max(c.since for t in schema.TABLES.values()
                                        for c in t.columns) == schema.SCHEMA_VERSION
    old = Table("toy", "a toy table", "syscall", (Column("pid", I32, "", "pid", False),))
    new = Table("toy", "a toy table", "syscall",
                (*old.columns, Column("numa", I32, "", "a new column", since=9)))
    assert schema_version([old]) == 1 and schema_version([old, new]) == 9
    assert new.absent_in(8) == {"numa"} and new.absent_in(9) == set()


def test_a_column_added_later_is_nullable() -> None:
    """A column newer than its table's first columns must be nullable: the parts written
    before it can only read it as null."""
    for t in schema.TABLES.values():
        first = min(c.since for c in t.columns)
        for c in t.columns:
            assert c.since == first or c.nullable, (t.name, c.name)


def _trace_without(tmp_path: Path, column: str, version: int) -> Path:
    """A trace whose processes part lacks `column` and says it is of schema `version`."""
    b = TraceBuilder()
    b.process(7, "worker")
    path = b.build(tmp_path / "t")
    (part,) = sorted((path / "processes").glob("*.parquet"))
    table = pq.read_table(part)
    table = table.drop_columns([column]).replace_schema_metadata(
        {b"gputrace.schema_version": str(version).encode()})
    pq.write_table(table, part)
    return path


def test_an_older_part_reads_a_newer_column_as_null(tmp_path: Path) -> None:
    col = schema.PROCESSES.column("pod_uid")
    assert col.since > 1
    trace = open_trace(_trace_without(tmp_path, "pod_uid", col.since - 1))
    trace.validate()
    df = trace.scan("processes").collect()
    assert df["pod_uid"].to_list() == [None] and df["comm"].to_list() == ["worker"]
    assert df.schema == schema.PROCESSES.polars_schema


def test_a_part_of_the_columns_version_must_hold_it(tmp_path: Path) -> None:
    col = schema.PROCESSES.column("pod_uid")
    with pytest.raises(TraceError, match="columns missing from table processes: pod_uid"):
        open_trace(_trace_without(tmp_path, "pod_uid", col.since)).validate()
    # a column there from the start is missing from a part of any version
    assert schema.PROCESSES.column("comm").since == 1
    with pytest.raises(TraceError, match="columns missing from table processes: comm"):
        open_trace(_trace_without(tmp_path / "b", "comm", 1)).validate()


def test_written_parts_carry_the_derived_version(tmp_path: Path) -> None:
    b = TraceBuilder()
    b.process(7, "worker")
    path = b.build(tmp_path / "t")
    (part,) = sorted((path / "processes").glob("*.parquet"))
    md = pq.read_metadata(part).schema.to_arrow_schema().metadata
    assert md[b"gputrace.schema_version"] == str(schema.SCHEMA_VERSION).encode()
