"""Writing a trace directory: Arrow batches per table in, rotated zstd Parquet parts
and an atomically rewritten manifest out.

The recorder's last stage (and the builder's and tools' only one). It needs
pyarrow and the schema, never polars or pydantic, so recording hosts install
neither. File names and the safe file operations are in `gputrace.trace.files`;
creating or replacing the directory is `gputrace.trace.output`'s job.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gputrace import schema
from gputrace.errors import TraceError
from gputrace.trace import rawparts
from gputrace.trace.files import (
    MANIFEST,
    MANIFEST_TMP,
    PENDING,
    STATUS_COMPLETE,
    STATUS_RECORDING,
    abs_trace_path,
    check_private,
    create_file,
    open_dir_at,
    part_name,
)
from gputrace.trace.output import open_output

__all__ = ["TraceWriter", "write_tables"]


def _stderr_note(message: str) -> None:
    print(f"gputrace: {message}", file=sys.stderr, flush=True)



class TraceWriter:
    """Collects Arrow batches per table and writes them as rotated zstd parts.

    `append` only buffers; `rotate` (called by the recorder on a timer, and
    automatically when a table's buffer passes `rotate_rows`) writes one part
    per table with buffered rows, then rewrites the manifest. Every file goes
    through the directory descriptor opened here, so renaming the directory
    away (or replacing it with a link) mid-recording changes nothing: the
    trace is finished where the directory went.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        manifest: Mapping[str, Any] | None = None,
        force: bool = False,
        rotate_rows: int = 4_000_000,
        compression_level: int = 3,
        note: Callable[[str], None] | None = None,
    ) -> None:
        self.path = Path(path)
        self._note = note or _stderr_note
        self._fd = open_output(abs_trace_path(path), force, self._note)
        self._table_fds: dict[str, int] = {}
        self.rotate_rows = rotate_rows
        self.compression_level = compression_level
        self._buffers: dict[str, list[pa.RecordBatch]] = {n: [] for n in schema.TABLES}
        self._buffered_rows: dict[str, int] = dict.fromkeys(schema.TABLES, 0)
        # each buffered batch's schema metadata, for the part's footer sets (PartSet)
        self._metas: dict[str, list[Mapping[bytes, bytes] | None]] = {n: [] for n in schema.TABLES}
        self._parts: dict[str, int] = dict.fromkeys(schema.TABLES, 0)
        self._rows: dict[str, int] = dict.fromkeys(schema.TABLES, 0)
        # raw parts (rawparts.py): compressed frames buffered per table, their
        # header, records buffered, and raw parts and records written
        self._raw: dict[str, list[bytes]] = {n: [] for n in schema.TABLES}
        self._raw_header: dict[str, bytes] = {}
        self._raw_buffered: dict[str, int] = dict.fromkeys(schema.TABLES, 0)
        self._raw_bytes: dict[str, int] = dict.fromkeys(schema.TABLES, 0)
        self._raw_parts: dict[str, int] = dict.fromkeys(schema.TABLES, 0)
        self._raw_rows: dict[str, int] = dict.fromkeys(schema.TABLES, 0)
        self._pending: set[str] = set()  # tables with a PENDING file on disk
        self.manifest: dict[str, Any] = {
            "format": schema.FORMAT_NAME,
            "format_version": schema.FORMAT_VERSION,
            "schema_version": schema.SCHEMA_VERSION,
            "gputrace_version": _version(),
            "status": STATUS_RECORDING,
            "created_unix_s": time.time(),
            "layers": [],
            "hooks": {"attached": [], "skipped": []},
            "drops": {},
            "tables": {},
        }
        if manifest:
            self.manifest.update(manifest)
        try:
            self._write_manifest()
        except BaseException:
            self._close_fds()
            raise

    def append(self, table: str, data: pa.RecordBatch | pa.Table) -> None:
        """Buffer rows for `table`; they must match (or safely cast to) its schema."""
        t = schema.table(table) if table in schema.TABLES else None
        if t is None:
            raise TraceError(f"unknown table {table!r}")
        batch = _conform(t, data)
        if batch.num_rows == 0:
            return
        self._buffers[table].append(batch)
        self._metas[table].append(data.schema.metadata)
        self._buffered_rows[table] += batch.num_rows
        if self._buffered_rows[table] >= self.rotate_rows:
            self._flush_table(table)
            self._write_manifest()

    def append_raw(self, table: str, record: str, dtype: np.dtype[Any],
                   data: bytes | memoryview) -> None:  # fmt: skip
        """Buffer whole `record` structs of `dtype` for `table` undecoded: they are
        compressed now and written as a raw part at the next rotation, for
        `gputrace convert` to decode (rawparts.py)."""
        if table not in schema.TABLES:
            raise TraceError(f"unknown table {table!r}")
        if len(data) % dtype.itemsize:
            raise TraceError(f"table {table}: {len(data)} raw bytes are not whole "
                             f"{dtype.itemsize}-byte {record} records")  # fmt: skip
        if not len(data):
            return
        head = rawparts.header(table, record, dtype)
        if self._raw_header.setdefault(table, head) != head:
            raise TraceError(f"table {table}: raw records of two layouts in one trace")
        f = rawparts.frame(data)
        self._raw[table].append(f)
        self._raw_buffered[table] += len(data) // dtype.itemsize
        self._raw_bytes[table] += len(f)
        if self._raw_bytes[table] >= RAW_ROTATE_BYTES:
            self._flush_raw(table)
            self._write_manifest()

    @property
    def raw_parts_written(self) -> int:
        """Raw parts written so far, all tables."""
        return sum(self._raw_parts.values())

    def update_manifest(self, **fields: Any) -> None:
        """Merge fields into the manifest; written at the next rotation or close."""
        self.manifest.update(fields)

    def set_pending(self, table: str, data: pa.Table | None) -> None:
        """Replace `table`'s PENDING rows (things still in progress, e.g. processes
        still running) by `data` (None or no rows: remove them). Written at once,
        whole: a recorder killed later leaves them for `gputrace convert`."""
        if table not in schema.TABLES:
            raise TraceError(f"unknown table {table!r}")
        if data is None or data.num_rows == 0:
            if table in self._pending:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(PENDING, dir_fd=self._table_dir(table))
                self._pending.discard(table)
            return
        t = schema.table(table)
        arrow = pa.Table.from_batches([_conform(t, data)], schema=t.arrow_schema)
        write_part(self._table_dir(table), PENDING, arrow, self.path / table,
                   self.compression_level)  # fmt: skip
        self._pending.add(table)

    def rotate(self) -> None:
        """Write every buffered table as a new part, then the manifest."""
        self._flush_all()
        self._write_manifest()

    def close(self, status: str = STATUS_COMPLETE) -> None:
        """Write what is buffered and the final manifest; release the directory.
        PENDING rows are removed: the final rows of what they held are in the
        parts now (`gputrace convert` drops any it finds in the parts)."""
        self._flush_all()
        for table in sorted(self._pending):
            self.set_pending(table, None)
        self.manifest["status"] = status
        self._write_manifest()
        if self.relocated():
            self._note(f"warning: {self.path} was moved or replaced while recording; the "
                       "trace was finished in the original directory, wherever it is now")
        self._close_fds()

    def relocated(self) -> bool:
        """Does `path` no longer name the directory this writer writes into?"""
        if self._fd < 0:
            return False
        mine = os.fstat(self._fd)
        try:
            now = os.stat(self.path, follow_symlinks=False)
        except OSError:
            return True
        return (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino)

    def _close_fds(self) -> None:
        for fd in [*self._table_fds.values(), self._fd]:
            if fd >= 0:
                os.close(fd)
        self._table_fds = {}
        self._fd = -1

    def _table_dir(self, name: str) -> int:
        fd = self._table_fds.get(name)
        if fd is not None:
            return fd
        # exists when --force kept it (it holds files gputrace did not write): checked below
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=self._fd)
        fd = open_dir_at(self._fd, name, self.path / name)
        try:
            check_private(fd, self.path / name)
            os.fchmod(fd, 0o700)
        except BaseException:
            os.close(fd)
            raise
        self._table_fds[name] = fd
        return fd

    def _flush_all(self) -> None:
        for name in schema.TABLES:
            if self._buffered_rows[name]:
                self._flush_table(name)
            if self._raw_buffered[name]:
                self._flush_raw(name)

    def _flush_table(self, name: str) -> None:
        t = schema.table(name)
        arrow = pa.Table.from_batches(self._buffers[name], schema=t.arrow_schema)
        arrow = arrow.replace_schema_metadata({**(arrow.schema.metadata or {}),
                                               **footer_sets(t, self._metas[name])})
        n = self._parts[name] + self._raw_parts[name] + 1
        write_part(self._table_dir(name), part_name(n), arrow, self.path / name,
                   self.compression_level)  # fmt: skip
        self._parts[name] += 1
        self._rows[name] += arrow.num_rows
        self._buffers[name] = []
        self._metas[name] = []
        self._buffered_rows[name] = 0

    def _flush_raw(self, name: str) -> None:
        n = self._parts[name] + self._raw_parts[name] + 1
        chunks = [self._raw_header[name], *self._raw[name]]
        write_file(self._table_dir(name), rawparts.raw_part_name(n), self.path / name,
                   lambda f: f.writelines(chunks))  # fmt: skip
        self._raw_parts[name] += 1
        self._raw_rows[name] += self._raw_buffered[name]
        self._raw[name] = []
        self._raw_buffered[name] = 0
        self._raw_bytes[name] = 0

    def _write_manifest(self) -> None:
        tables: dict[str, Any] = {}
        for n in schema.TABLES:
            if self._parts[n] or self._raw_parts[n]:
                tables[n] = {"rows": self._rows[n], "parts": self._parts[n]}
            if self._raw_parts[n]:
                tables[n].update(raw_parts=self._raw_parts[n], raw_records=self._raw_rows[n])
        self.manifest["tables"] = tables
        write_manifest(self._fd, self.manifest, self.path)


RAW_ROTATE_BYTES = 256 << 20
"""Compressed raw bytes a table buffers before a rotation is forced (~40 M events)."""


def write_file(folder: int, final: str, where: Path, fill: Callable[[Any], object]) -> None:
    """Create `final` in the directory `folder` by `fill(file)` on a new `.tmp` file,
    then rename it into place (a reader never sees a part half written)."""
    tmp = final + ".tmp"
    with os.fdopen(create_file(folder, tmp, where), "wb") as f:
        # A file object, not a path: nothing is ever opened by name here.
        fill(f)
    # rename replaces a directory entry; it never writes through a link planted there
    os.rename(tmp, final, src_dir_fd=folder, dst_dir_fd=folder)


def footer_sets(t: schema.Table, metas: Iterable[Mapping[bytes, bytes] | None]
                ) -> dict[bytes, bytes]:  # fmt: skip
    """The footer entries (`schema.PartSet`) of a part of `t` made of batches with
    schema metadata `metas`: each set every batch carries, as their union."""
    metas = list(metas)
    out: dict[bytes, bytes] = {}
    for ps in t.part_sets:
        key = ps.key.encode()
        value = ps.union((m or {}).get(key) for m in metas) if metas else None
        if value is not None:
            out[key] = value
    return out


def write_part(folder: int, final: str, arrow: pa.Table, where: Path, level: int = 3) -> None:
    """One zstd Parquet part of a table, written whole (the recorder's)."""
    write_file(folder, final, where,
               lambda f: pq.write_table(arrow, f, **_part_options(arrow.schema, level)))


ROW_GROUP_ROWS = 1 << 20
"""Rows per row group (pyarrow's default, which `write_part` keeps)."""


def stream_part(folder: int, final: str, where: Path, t: schema.Table,
                batches: Iterable[pa.RecordBatch], level: int = 3) -> int:  # fmt: skip
    """One zstd Parquet part of `t` from batches made one after another (`gputrace
    convert`): encoded as `write_part` encodes, a row group at a time, so at most
    ROW_GROUP_ROWS rows are held at once, with the same footer sets; returns the rows
    written."""
    rows = 0
    schema_ = t.arrow_schema

    def fill(f: Any) -> None:
        nonlocal rows
        with pq.ParquetWriter(f, schema_, **_part_options(schema_, level)) as w:
            held: list[pa.RecordBatch] = []
            metas: list[Mapping[bytes, bytes] | None] = []
            n = 0
            for b in batches:
                metas.append(b.schema.metadata)  # from_batches below keeps schema_'s own
                held.append(b)
                n += b.num_rows
                if n >= ROW_GROUP_ROWS:
                    w.write_table(pa.Table.from_batches(held, schema=schema_), ROW_GROUP_ROWS)
                    rows, held, n = rows + n, [], 0
            if n:
                w.write_table(pa.Table.from_batches(held, schema=schema_), ROW_GROUP_ROWS)
                rows += n
            if sets := footer_sets(t, metas):
                # JSON is ASCII (json.dumps escapes the rest)
                w.add_key_value_metadata({k.decode(): v.decode() for k, v in sets.items()})

    write_file(folder, final, where, fill)
    return rows


def write_manifest(dir_fd: int, manifest: Mapping[str, Any], where: Path) -> None:
    """Replace the manifest of the trace directory `dir_fd` atomically."""
    data = json.dumps(manifest, indent=2, sort_keys=True).encode() + b"\n"
    fd = create_file(dir_fd, MANIFEST_TMP, where)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(MANIFEST_TMP, MANIFEST, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    os.fsync(dir_fd)


def _conform(t: schema.Table, data: pa.RecordBatch | pa.Table) -> pa.RecordBatch:
    names = list(data.schema.names)
    expected = [c.name for c in t.columns]
    missing = [n for n in expected if n not in names]
    extra = [n for n in names if n not in expected]
    if missing or extra:
        raise TraceError(f"table {t.name}: missing columns {missing}, unexpected columns {extra}")
    tbl = pa.Table.from_batches([data]) if isinstance(data, pa.RecordBatch) else data
    tbl = tbl.select(expected).cast(t.arrow_schema)
    batches = tbl.combine_chunks().to_batches()
    if not batches:
        return pa.RecordBatch.from_pylist([], schema=t.arrow_schema)
    return batches[0]


def _version() -> str:
    from gputrace import __version__

    return __version__


def _part_options(schema_: pa.Schema, level: int) -> dict[str, Any]:
    """How every Parquet part is written: zstd at `level`, statistics, `_encodings`."""
    return {"compression": "zstd", "compression_level": level, "write_statistics": True,
            **_encodings(schema_.names)}


DELTA_COLUMNS = ("ts_ns", "seq", "time_us")
"""Columns rising within a part, nearly every value new: delta-encoded, which a
dictionary cannot shrink."""


def _encodings(columns: list[str]) -> dict[str, Any]:
    """Parquet encodings of a part: the DELTA_COLUMNS as deltas (`ts_ns`: 30 % smaller
    parts, and polars reads the column 3x faster; a 10^7-entry snapshot's `seq` and
    `time_us`: 4x less encoding CPU, 13 MB of `seq` a part become 15 kB); every other
    column dictionary-encoded."""
    delta = [c for c in DELTA_COLUMNS if c in columns]
    if not delta:
        return {"use_dictionary": True}
    return {"use_dictionary": [c for c in columns if c not in delta],
            "column_encoding": dict.fromkeys(delta, "DELTA_BINARY_PACKED")}


def write_tables(
    path: str | os.PathLike[str],
    tables: Mapping[str, pa.Table | pa.RecordBatch],
    *,
    manifest: Mapping[str, Any] | None = None,
    force: bool = False,
    status: str = STATUS_COMPLETE,
) -> Path:
    """Write whole tables as a trace (used by the builder and tools)."""
    w = TraceWriter(path, manifest=manifest, force=force)
    for name, data in tables.items():
        w.append(name, data)
    w.close(status)
    return w.path
