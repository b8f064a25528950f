"""Reading a trace directory: `open_trace(path)` checks it and `Trace.scan(table)`
gives a typed polars LazyFrame over a table's parts.

The entry point of everything after recording (analyses, renderers, export):
it validates the manifest and every part's footer up front, so a bad trace is a
one-line error before any report starts, and says where the directory's content
differs from what its manifest announces (`trace_warnings`). Parts are listed
from the directory, not from the manifest (see `gputrace.trace.files`); polars
is imported only when a scan needs it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from gputrace import schema
from gputrace.errors import TraceError
from gputrace.trace.files import MANIFEST, PART_GLOB, PENDING, STATUS_COMPLETE, read_manifest
from gputrace.trace.rawparts import RAW_GLOB

if TYPE_CHECKING:  # polars is imported where a scan needs it
    import polars as pl

__all__ = ["CHOSEN_SIZES", "SIZE_LIMIT", "ManifestFacts", "Trace", "in_current_schema",
           "open_trace", "trace_warnings"]

SIZE_LIMIT = 1 << 48
"""Bytes no allocation, mapping or reservation can span (256 TiB: more than any GPU or
host holds). A traced process chooses the sizes it passes (`cuMemAlloc((size_t)-1)`
through a libcuda of its own); the trace keeps them verbatim (uint64) and the
analyses count a larger one as 0 bytes, with a warning (`trace_warnings`)."""

CHOSEN_SIZES = {"cuda_calls": ("size_bytes",), "ioctls": ("size_bytes", "va_length"),
                "mappings": ("length",),
                "allocator_events": ("size_bytes", "device_free_bytes"),
                "allocator_segments": ("total_size_bytes", "allocated_size_bytes",
                                       "active_size_bytes", "requested_size_bytes"),
                "allocator_blocks": ("size_bytes", "requested_size_bytes")}
"""The size columns whose values a traced process passes (what allocation lifetimes read;
the caching allocator's, read from its memory by the torch_allocator layer or a snapshot
someone wrote, which the allocator analyses add up as signed integers)."""


class ManifestFacts:
    """What a report reads of a manifest, shared by a trace directory and an exported
    trace of a fleet dataset (one reading of status, layers and drops)."""

    manifest: dict[str, Any]

    @property
    def status(self) -> str:
        return str(self.manifest.get("status", "unknown"))

    @property
    def layers(self) -> list[str]:
        return [str(x) for x in self.manifest.get("layers", [])]

    @property
    def drops(self) -> dict[str, int]:
        return {str(k): int(v) for k, v in dict(self.manifest.get("drops", {})).items()}


class Trace(ManifestFacts):
    """A trace directory opened for reading; cheap to create, scans are lazy."""

    def __init__(self, path: Path, manifest: dict[str, Any]) -> None:
        self.path = path
        self.manifest = manifest
        self._warnings: list[str] | None = None

    def parts(self, table: str) -> list[Path]:
        _check_table(table)
        folder = self.path / table
        if not folder.is_dir():
            return []
        # only regular files: a FIFO or device named like a part would hang or flood a scan
        return sorted(p for p in folder.glob(PART_GLOB) if p.is_file())

    def rows(self, table: str) -> int:
        return sum(pq.read_metadata(p).num_rows for p in self.parts(table))

    def part_set(self, table: str, key: str) -> list[tuple[object, ...]] | None:
        """The footer set `key` of `table` (`schema.PartSet`) over all its parts; None
        when the table has none of that name, or any part lacks it or cannot say."""
        t = schema.table(_check_table(table))
        ps = next((x for x in t.part_sets if x.key == key), None)
        if ps is None:
            return None
        values: list[bytes | None] = []
        for p in self.parts(table):
            try:
                values.append((pq.read_metadata(p).metadata or {}).get(key.encode()))
            except (OSError, pa.ArrowException):
                return None  # `validate` names a bad part; here it only means unknown
        rows = ps.union_rows(values) if values else None
        return None if rows is None else ps.in_order(rows)

    def scan(self, table: str, parts: list[Path] | None = None) -> pl.LazyFrame:
        """A typed LazyFrame over all parts of `table` (empty and typed when none), or
        over `parts` only (some of `parts(table)`)."""
        import polars as pl

        t = schema.table(_check_table(table))
        parts = self.parts(table) if parts is None else parts
        if not parts:
            return pl.LazyFrame(schema=t.polars_schema)
        # Parts of an older schema version, written before a nullable column was
        # added, read it as nulls (`_check_part` refuses a part of the column's version
        # or newer without it).
        return pl.scan_parquet([str(p) for p in parts], schema=t.polars_schema,
                               missing_columns="insert").select(
            [pl.col(n).cast(dt) for n, dt in t.polars_schema.items()]
        )

    def read_part(self, table: str, part: Path) -> pa.Table:
        """One part of `table` (from `parts`) in the current schema, as `scan` reads
        it: for copying a recording part for part (`import --into`)."""
        t = schema.table(_check_table(table))
        try:
            data = pq.read_table(part)
        except (OSError, pa.ArrowException) as e:
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise TraceError(f"corrupt Parquet part {part}: {reason}") from None
        return in_current_schema(t, data, part)

    def validate(self) -> None:
        """Read every part's footer; raise TraceError naming the first bad part."""
        for name in schema.TABLES:
            for p in self.parts(name):
                _check_part(schema.table(name), p)

    def warnings(self) -> list[str]:
        """See `trace_warnings` (computed once per Trace)."""
        if self._warnings is None:
            self._warnings = _integrity_warnings(self)
        return list(self._warnings)


def in_current_schema(t: schema.Table, data: pa.Table, where: Path) -> pa.Table:
    """`data` (rows of table `t` written by any schema version this gputrace reads)
    with the current columns, in order and type: a nullable column added after it
    was written reads as nulls, as in `Trace.scan`; a required one missing, or one
    whose values cannot be cast, is a one-line TraceError."""
    cols = []
    for f in t.arrow_schema:
        if f.name in data.column_names:
            try:
                cols.append(data.column(f.name).cast(f.type))
            except (pa.ArrowException, ValueError) as e:
                raise TraceError(f"{where}: table {t.name} column {f.name}: "
                                 f"{str(e).splitlines()[0]}") from None
        elif f.nullable:
            cols.append(pa.nulls(data.num_rows, f.type))
        else:
            raise TraceError(f"{where}: columns missing from table {t.name}: {f.name}")
    return pa.Table.from_arrays(cols, schema=t.arrow_schema)


def _check_table(table: str) -> str:
    if table not in schema.TABLES:
        known = ", ".join(schema.TABLES)
        raise TraceError(f"unknown table {table!r} (tables: {known})")
    return table


def _kind(t: pa.DataType) -> str:
    """The family of an Arrow type, as far as scans can cast without changing meaning."""
    if pa.types.is_dictionary(t):
        return _kind(t.value_type)
    if pa.types.is_integer(t):
        return "integer"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_floating(t):
        return "float"
    return str(t)


def _check_part(t: schema.Table, path: Path) -> None:
    """One part's footer: readable, not newer, every column present, typed and non-null
    where the schema says so (null counts come from the footer's statistics)."""
    try:
        meta = pq.read_metadata(path)
        arrow_schema = meta.schema.to_arrow_schema()
    except (OSError, pa.ArrowException) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise TraceError(f"corrupt Parquet part {path}: {reason}") from None
    raw_version = (arrow_schema.metadata or {}).get(b"gputrace.schema_version", b"0")
    try:
        version = int(raw_version.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise TraceError(f"{path}: schema version metadata {raw_version[:40]!r} is not a "
                         "number; not a gputrace part") from None
    if version > schema.SCHEMA_VERSION:
        raise TraceError(
            f"{path} has schema version {version}, newer than this gputrace "
            f"({schema.SCHEMA_VERSION}); upgrade gputrace"
        )
    names = arrow_schema.names
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise TraceError(f"{path}: table {t.name} column {twice[0]} appears more than once; "
                         "refusing to guess which one is meant")
    # A part holds every column of its schema version; it may lack the nullable columns
    # added since (`Column.since`: they read as null).
    absent = t.absent_in(version)
    missing = [c.name for c in t.columns if c.name not in names and c.name not in absent]
    if missing:
        raise TraceError(f"{path}: columns missing from table {t.name}: {', '.join(missing)}")
    for c in t.columns:
        if c.name not in arrow_schema.names:
            continue  # a nullable column added after this part was written
        got = arrow_schema.field(c.name).type
        if _kind(got) != _kind(c.type):
            raise TraceError(f"{path}: table {t.name} column {c.name} is stored as {got}, "
                             f"expected {c.type}; refusing to guess what it means")
    required = [c.name for c in t.columns if not c.nullable]
    for name, nulls in _null_counts(meta, path, required).items():
        if nulls:
            raise TraceError(f"{path}: table {t.name} column {name} has {nulls} null values, "
                             "but the schema says it is never null")


def _null_counts(meta: pq.FileMetaData, path: Path, columns: list[str]) -> dict[str, int]:
    """Nulls per column from row-group statistics; columns without them are read."""
    index = {meta.schema.column(i).path: i for i in range(meta.num_columns)}
    counts = dict.fromkeys(columns, 0)
    unknown: set[str] = set()
    for rg in range(meta.num_row_groups):
        group = meta.row_group(rg)
        for name in columns:
            if name not in index:
                unknown.add(name)
                continue
            st = group.column(index[name]).statistics
            nulls = st.null_count if st is not None and st.has_null_count else None  # type: ignore[attr-defined]
            if nulls is None:
                unknown.add(name)
            else:
                counts[name] += nulls
    if unknown:
        try:
            table = pq.read_table(path, columns=sorted(unknown))
        except (OSError, pa.ArrowException) as e:
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise TraceError(f"corrupt Parquet part {path}: {reason}") from None
        for name in unknown:
            counts[name] = table.column(name).null_count
    return counts


def open_trace(path: str | os.PathLike[str], *, validate: bool = True,
               raw_ok: bool = False) -> Trace:  # fmt: skip
    """Open a trace directory; raises `TraceError` with a one-line reason. A trace
    holding raw parts (`record --raw`) is refused unless `raw_ok` (`gputrace info`:
    it reads the manifest, not the rows)."""
    p = Path(path)
    if not p.exists():
        raise TraceError(f"{p}: no such trace directory")
    if not p.is_dir():
        raise TraceError(f"{p} is not a trace directory (it is a file)")
    mpath = p / MANIFEST
    if not mpath.exists():
        raise TraceError(f"{p} is not a gputrace trace (no {MANIFEST})")
    manifest = read_manifest(None, mpath, mpath)
    trace = Trace(p, manifest)
    if not raw_ok:
        _refuse_raw(trace)
    if validate:
        trace.validate()
    return trace


def raw_parts_held(trace: Trace) -> str | None:
    """What raw parts (`record --raw`, or spilled by a recorder killed before it
    decoded them) the trace holds, and how to decode them; None when none."""
    held = {}
    for name in schema.TABLES:
        folder = trace.path / name
        n = sum(1 for p in folder.glob(RAW_GLOB) if p.is_file()) if folder.is_dir() else 0
        if n:
            held[name] = n
    if not held:
        return None
    what = ", ".join(f"{n} of {t}" for t, n in held.items())
    return (f"{trace.path} holds raw parts not decoded yet ({what}, written undecoded by the "
            f"recorder): run `gputrace convert {trace.path}` first")  # fmt: skip


def _refuse_raw(trace: Trace) -> None:
    """Raw parts are rows no reader decodes: say how to convert them rather than
    report on the tables without them."""
    held = raw_parts_held(trace)
    if held is not None:
        raise TraceError(held)


# ---------------------------------------------------------------- integrity
def window_warnings(m: dict[str, Any]) -> list[str]:
    """A trace that holds a window of a recording (`record --keep`, or an incident
    of `--freeze-on`) misses what came before it: say so, with where it starts."""
    w = m.get("window")
    if not isinstance(w, dict):
        return []
    if w.get("trigger") is not None:
        return [f"this trace is an incident window ({w.get('trigger')} at "
                f"{w.get('incident_ts_ns')} ns) of a flight recording: events from "
                f"{w.get('from_ts_ns')} to {w.get('to_ts_ns')} ns only; memory allocated "
                "before it has no allocation row here (its frees and use look unmatched)"]
    if not w.get("deleted_parts"):
        return []
    return [f"this trace keeps a window (record --keep {w.get('keep')}): "
            f"{w.get('deleted_parts')} parts ({w.get('deleted_rows')} rows) before "
            f"{w.get('from_ts_ns')} ns were deleted; memory allocated before it has no "
            "allocation row here (its frees and use look unmatched)"]



def trace_warnings(trace: Trace) -> list[str]:
    """Is what the directory holds what the manifest announces? One line per doubt.

    Warns (does not fail) when the parts or rows present differ from the
    manifest's `tables` (fewer than announced, or any difference once the
    recording completed; an unfinished recording may hold one rotation more than
    its manifest), when the manifest lists tables this gputrace does not know,
    and when event rows (`ts_ns`) lie outside the manifest's
    [start_ts_ns, end_ts_ns]. Reports should print these with their own
    warnings; status and drops are reported by the analyses' own warnings.
    """
    return trace.warnings()


def _integrity_warnings(trace: Trace) -> list[str]:
    out: list[str] = []
    m = trace.manifest
    announced: dict[str, Any] = m.get("tables", {})
    finished = trace.status == STATUS_COMPLETE
    unknown = sorted(set(announced) - set(schema.TABLES))
    if len(unknown) == 1:
        out.append(f"the manifest lists table {unknown[0]!r}, unknown to this gputrace; "
                   "ignored")
    elif unknown:  # one line however many: a manifest can name 10^5 of them
        named = ", ".join(repr(n) for n in unknown[:5]) + (", ..." if len(unknown) > 5 else "")
        out.append(f"the manifest lists {len(unknown)} tables unknown to this gputrace "
                   f"({named}); ignored")
    out += window_warnings(m)
    for name in schema.TABLES:
        parts = trace.parts(name)
        rows = sum(pq.read_metadata(p).num_rows for p in parts)
        want = announced.get(name, {"rows": 0, "parts": 0})
        want_rows, want_parts = int(want["rows"]), int(want["parts"])
        short = rows < want_rows or len(parts) < want_parts
        if short or (finished and (rows, len(parts)) != (want_rows, want_parts)):
            out.append(
                f"table {name}: the manifest announces {want_rows} rows in {want_parts} "
                f"parts, the trace holds {rows} rows in {len(parts)} parts"
                + ("; results miss the absent rows" if short else "")
            )
    for name, cols in CHOSEN_SIZES.items():
        for col in cols:
            n, largest = _impossible(trace.parts(name), col)
            if n:
                out.append(
                    f"table {name}: {n} rows have a {col} over 256 TiB (largest "
                    f"{largest} bytes), more than any GPU holds; analyses count them as 0 bytes"
                )
    for name in schema.TABLES:
        pending = trace.path / name / PENDING
        if pending.is_file():
            out.append(f"table {name}: rows of what was still running when the recording "
                       f"stopped are in {pending}, not yet in the table: run `gputrace "
                       f"convert {trace.path}` to keep them")  # fmt: skip
    start, end = m.get("start_ts_ns"), m.get("end_ts_ns")
    if start is None and end is None:
        return out
    for name, t in schema.TABLES.items():
        if "ts_ns" not in {c.name for c in t.columns}:
            continue
        n = _outside(trace.parts(name), start, end)
        if n:
            out.append(
                f"table {name}: {n} rows lie outside the trace's time span "
                f"[{start if start is not None else '?'}, {end if end is not None else '?'}] ns "
                "(manifest start_ts_ns/end_ts_ns); time-based results include them"
            )
    return out


def _suspect(parts: list[Path], col: str, lo: int | None, hi: int | None) -> list[Path]:
    """The parts whose footer statistics cannot rule out a value of `col` below `lo` or
    above `hi` (a row group without statistics is suspect)."""
    out = []
    for p in parts:
        meta = pq.read_metadata(p)
        names = [meta.schema.column(i).path for i in range(meta.num_columns)]
        if col not in names:
            continue
        i = names.index(col)
        for rg in range(meta.num_row_groups):
            st = meta.row_group(rg).column(i).statistics
            a, b = (st.min, st.max) if st is not None and st.has_min_max else (None, None)
            if (a is None or b is None or (lo is not None and a < lo)
                    or (hi is not None and b > hi)):
                out.append(p)
                break
    return out


def _impossible(parts: list[Path], col: str) -> tuple[int, int]:
    """How many values of `col` exceed SIZE_LIMIT, and the largest; footers first."""
    suspect = _suspect(parts, col, None, SIZE_LIMIT)
    if not suspect:
        return 0, 0
    import polars as pl

    # the parts' own type (uint64), never a cast: the value is the evidence
    got = (pl.scan_parquet([str(p) for p in suspect]).select(pl.col(col))
           .filter(pl.col(col) > SIZE_LIMIT)
           .select(pl.len().alias("n"), pl.col(col).max().alias("top")).collect())
    n = int(got["n"][0])
    return n, (int(got["top"][0]) if n else 0)


def _outside(parts: list[Path], start: int | None, end: int | None) -> int:
    """Rows of `parts` with ts_ns outside [start, end]; footers first, data only if needed."""
    suspect = _suspect(parts, "ts_ns", start, end)
    if not suspect:
        return 0
    import polars as pl

    ts = pl.col("ts_ns")
    lo = ts < start if start is not None else pl.lit(False)
    hi = ts > end if end is not None else pl.lit(False)
    return int(pl.scan_parquet([str(p) for p in suspect]).select(ts.cast(pl.Int64))
               .filter(lo | hi).select(pl.len()).collect().item())
