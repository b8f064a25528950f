"""How a table is described: `Column` and `Table`, the versions written into every
trace, and the column shorthands the table modules are written in.

The bottom of the schema package: every other schema module builds on it.
Conventions: snake_case names with the unit in the name (`ts_ns`,
`size_bytes`); timestamps are CLOCK_MONOTONIC nanoseconds (the manifest holds
the offset to wall-clock time); enumerations are stored twice, as a small
integer code and as its readable name (Parquet dictionary-encodes the name, so
it costs almost nothing on disk): `enum_columns` makes that pair.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    import polars as pl

# The tables' version (schema.SCHEMA_VERSION) is derived from the columns' `since`, in
# the catalog. The trace directory's own format (manifest layout, part naming), versioned apart from
# the tables' columns.
FORMAT_NAME = "gputrace-trace"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    unit: str
    doc: str
    nullable: bool = True
    since: int = 1
    """The schema version that added it to its table (1: it has been there from the
    table's first version). A part of an older version lacks it, and readers fill it with
    nulls; a column added later is nullable, so that older parts can be read. Declaring it
    is the version bump: schema.SCHEMA_VERSION is the newest `since`."""


@dataclass(frozen=True)
class PartSet:
    """A footer entry of a table's Parquet parts: the distinct values of `columns`
    among the part's rows, as JSON (a sorted list of lists), under the key-value
    metadata `key`. A part holds it only when every row came from a writer that knows
    the set (the recorder's decoder); readers treat a part without it as unknown and
    scan the rows instead. It lets a reader learn, from the footers alone, what would
    otherwise cost a scan of string columns."""

    key: str
    columns: tuple[str, ...]
    doc: str

    def encode(self, rows: Iterable[Sequence[object]]) -> bytes:
        """The footer value of `rows` (duplicates dropped)."""
        return json.dumps(self.in_order(rows)).encode()

    @staticmethod
    def in_order(rows: Iterable[Sequence[object]]) -> list[tuple[object, ...]]:
        """`rows` without duplicates, in the footer's order."""
        return sorted({tuple(r) for r in rows}, key=repr)

    def decode(self, value: bytes | None) -> list[tuple[object, ...]] | None:
        """The rows of a footer value; None when absent or not a list of rows of
        len(columns) scalars (a damaged or foreign footer is unknown, not an error)."""
        if value is None:
            return None
        try:
            rows = json.loads(value)
        except (UnicodeDecodeError, ValueError):
            return None
        if not isinstance(rows, list) or not all(
                isinstance(r, list) and len(r) == len(self.columns)
                and all(isinstance(v, (int, str)) and not isinstance(v, bool) for v in r)
                for r in rows):
            return None
        return [tuple(r) for r in rows]

    def union(self, values: Iterable[bytes | None]) -> bytes | None:
        """The footer value of a part made of batches with these values; None when any
        of them lacks one (the set is then unknown)."""
        rows = self.union_rows(values)
        return None if rows is None else self.encode(rows)

    def union_rows(self, values: Iterable[bytes | None]) -> set[tuple[object, ...]] | None:
        """The rows of all these footer values; None when any lacks one or cannot be
        read."""
        rows: set[tuple[object, ...]] = set()
        distinct: set[bytes] = set()
        for v in values:
            if v is None:
                return None
            distinct.add(v)
        for v in distinct:  # batches of a busy process mostly repeat one set: read once
            got = self.decode(v)
            if got is None:
                return None
            rows.update(got)
        return rows


@dataclass(frozen=True)
class Table:
    name: str
    doc: str
    layer: str
    columns: tuple[Column, ...]
    other_layers: tuple[str, ...] = ()
    """Further layers whose recorders also write rows into this table."""
    part_sets: tuple[PartSet, ...] = ()
    """Footer entries its parts may carry (`PartSet`)."""

    @property
    def layers(self) -> tuple[str, ...]:
        return (self.layer, *self.other_layers)

    @property
    def arrow_schema(self) -> pa.Schema:
        from gputrace.schema import SCHEMA_VERSION  # the catalog's, of every table

        return pa.schema(
            [pa.field(c.name, c.type, nullable=c.nullable) for c in self.columns],
            metadata={b"gputrace.schema_version": str(SCHEMA_VERSION).encode()},
        )

    def absent_in(self, version: int) -> set[str]:
        """The columns a part of schema `version` may lack (they read as null): those
        added since."""
        return {c.name for c in self.columns if c.since > version and c.nullable}

    @property
    def polars_schema(self) -> pl.Schema:
        import polars as pl  # lazily: the recorder never needs polars

        empty = pl.from_arrow(self.arrow_schema.empty_table())
        assert isinstance(empty, pl.DataFrame)
        return empty.schema

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(name)


@dataclass(frozen=True)
class Catalog:
    """One schema module's part of the catalog: the trace layers it declares, in catalog
    order, and its tables, in catalog order (each names its layers). `schema.TABLES` and
    `schema.LAYERS` are these added up, in `schema.CATALOG_MODULES` order."""

    layers: tuple[str, ...]
    tables: tuple[Table, ...]


def schema_version(tables: Iterable[Table]) -> int:
    """The version of these tables: the newest column's `since`."""
    return max(c.since for t in tables for c in t.columns)


I8, I16, I32, I64 = pa.int8(), pa.int16(), pa.int32(), pa.int64()
U8, U16, U32, U64 = pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()
STR, BOOL, F64 = pa.string(), pa.bool_(), pa.float64()


def who(with_tid: bool = True) -> tuple[Column, ...]:
    """The columns saying when and in which process (and thread) an event happened."""
    cols = [
        Column("ts_ns", I64, "ns", "CLOCK_MONOTONIC time of the event (entry, for calls)", False),
        Column("pid", I32, "", "process id (tgid)", False),
    ]
    if with_tid:
        cols.append(Column("tid", I32, "", "thread id", False))
    cols.append(Column("comm", STR, "", "thread name at the time of the event"))
    return tuple(cols)

def enum_columns(name: str, values: dict[int, str], doc: str,
                 nullable: bool = False, since: int = 1) -> tuple[Column, ...]:
    """An enumeration's pair of columns: `<name>_code` (what BPF emits) and `<name>`."""
    listing = ", ".join(f"{k}={v}" for k, v in sorted(values.items()))
    return (
        Column(f"{name}_code", U8, "enum", f"{doc}: code ({listing})", nullable, since),
        Column(name, STR, "enum", f"{doc}: name", nullable, since),
    )
