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

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    import polars as pl

SCHEMA_VERSION = 2
"""Bumped whenever a column is added, removed, renamed or retyped."""
# The trace directory's own format (manifest layout, part naming), versioned apart from
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


@dataclass(frozen=True)
class Table:
    name: str
    doc: str
    layer: str
    columns: tuple[Column, ...]
    other_layers: tuple[str, ...] = ()
    """Further layers whose recorders also write rows into this table."""

    @property
    def layers(self) -> tuple[str, ...]:
        return (self.layer, *self.other_layers)

    @property
    def arrow_schema(self) -> pa.Schema:
        return pa.schema(
            [pa.field(c.name, c.type, nullable=c.nullable) for c in self.columns],
            metadata={b"gputrace.schema_version": str(SCHEMA_VERSION).encode()},
        )

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
                 nullable: bool = False) -> tuple[Column, ...]:
    """An enumeration's pair of columns: `<name>_code` (what BPF emits) and `<name>`."""
    listing = ", ".join(f"{k}={v}" for k, v in sorted(values.items()))
    return (
        Column(f"{name}_code", U8, "enum", f"{doc}: code ({listing})", nullable),
        Column(name, STR, "enum", f"{doc}: name", nullable),
    )
