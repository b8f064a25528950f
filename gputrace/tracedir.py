"""The trace directory: a manifest plus rotated Parquet parts per table.

Layout::

    <trace>/manifest.json
    <trace>/<table>/part-000001.parquet ...

Writes are crash-safe: every part and every manifest is written to a `*.tmp`
file and renamed into place, so a recorder killed with SIGKILL leaves a trace
that reads back, with status `recording`, missing at most the rows buffered
since the last rotation. Readers list parts from the directory, not from the
manifest, so a part renamed just before the kill is not lost either.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from gputrace import schema
from gputrace.errors import TraceError

FORMAT_NAME = "gputrace-trace"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
PART_GLOB = "part-*.parquet"

STATUS_RECORDING = "recording"
STATUS_COMPLETE = "complete"


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


class TraceWriter:
    """Collects Arrow batches per table and writes them as rotated zstd parts.

    `append` only buffers; `rotate` (called by the recorder on a timer, and
    automatically when a table's buffer passes `rotate_rows`) writes one part
    per table with buffered rows, then rewrites the manifest.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        manifest: Mapping[str, Any] | None = None,
        force: bool = False,
        rotate_rows: int = 4_000_000,
        compression_level: int = 3,
    ) -> None:
        self.path = Path(path)
        if self.path.exists():
            if not force:
                raise TraceError(f"{self.path} already exists (use --force to overwrite)")
            if not self.path.is_dir() or (
                any(self.path.iterdir()) and not (self.path / MANIFEST).exists()
            ):
                raise TraceError(f"{self.path} exists and is not a trace; refusing to overwrite")
            _remove_trace(self.path)
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.path, 0o700)
        self.rotate_rows = rotate_rows
        self.compression_level = compression_level
        self._buffers: dict[str, list[pa.RecordBatch]] = {n: [] for n in schema.TABLES}
        self._buffered_rows: dict[str, int] = dict.fromkeys(schema.TABLES, 0)
        self._parts: dict[str, int] = dict.fromkeys(schema.TABLES, 0)
        self._rows: dict[str, int] = dict.fromkeys(schema.TABLES, 0)
        self.manifest: dict[str, Any] = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
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
        self._write_manifest()

    def append(self, table: str, data: pa.RecordBatch | pa.Table) -> None:
        """Buffer rows for `table`; they must match (or safely cast to) its schema."""
        t = schema.table(table) if table in schema.TABLES else None
        if t is None:
            raise TraceError(f"unknown table {table!r}")
        batch = _conform(t, data)
        if batch.num_rows == 0:
            return
        self._buffers[table].append(batch)
        self._buffered_rows[table] += batch.num_rows
        if self._buffered_rows[table] >= self.rotate_rows:
            self._flush_table(table)
            self._write_manifest()

    def update_manifest(self, **fields: Any) -> None:
        """Merge fields into the manifest; written at the next rotation or close."""
        self.manifest.update(fields)

    def rotate(self) -> None:
        """Write every buffered table as a new part, then the manifest."""
        for name in schema.TABLES:
            if self._buffered_rows[name]:
                self._flush_table(name)
        self._write_manifest()

    def close(self, status: str = STATUS_COMPLETE) -> None:
        for name in schema.TABLES:
            if self._buffered_rows[name]:
                self._flush_table(name)
        self.manifest["status"] = status
        self._write_manifest()

    def _flush_table(self, name: str) -> None:
        t = schema.table(name)
        arrow = pa.Table.from_batches(self._buffers[name], schema=t.arrow_schema)
        self._parts[name] += 1
        folder = self.path / name
        folder.mkdir(mode=0o700, exist_ok=True)
        final = folder / f"part-{self._parts[name]:06d}.parquet"
        tmp = final.with_name(final.name + ".tmp")
        old_umask = os.umask(0o077)
        try:
            pq.write_table(
                arrow,
                tmp,
                compression="zstd",
                compression_level=self.compression_level,
                use_dictionary=True,
                write_statistics=True,
            )
        finally:
            os.umask(old_umask)
        os.replace(tmp, final)
        self._rows[name] += arrow.num_rows
        self._buffers[name] = []
        self._buffered_rows[name] = 0

    def _write_manifest(self) -> None:
        self.manifest["tables"] = {
            n: {"rows": self._rows[n], "parts": self._parts[n]}
            for n in schema.TABLES
            if self._parts[n]
        }
        data = json.dumps(self.manifest, indent=2, sort_keys=True).encode() + b"\n"
        _write_atomic(self.path / MANIFEST, data)


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


def _remove_trace(path: Path) -> None:
    for name in [*schema.TABLES, ""]:
        folder = path / name if name else path
        if folder.is_dir():
            for p in folder.iterdir():
                if p.is_file() and (p.suffix in {".parquet", ".tmp", ".json"}):
                    p.unlink()
        if name and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


def _version() -> str:
    from gputrace import __version__

    return __version__


class Trace:
    """A trace directory opened for reading; cheap to create, scans are lazy."""

    def __init__(self, path: Path, manifest: dict[str, Any]) -> None:
        self.path = path
        self.manifest = manifest

    @property
    def status(self) -> str:
        return str(self.manifest.get("status", "unknown"))

    @property
    def layers(self) -> list[str]:
        return [str(x) for x in self.manifest.get("layers", [])]

    @property
    def drops(self) -> dict[str, int]:
        return {str(k): int(v) for k, v in dict(self.manifest.get("drops", {})).items()}

    def parts(self, table: str) -> list[Path]:
        _check_table(table)
        folder = self.path / table
        return sorted(folder.glob(PART_GLOB)) if folder.is_dir() else []

    def rows(self, table: str) -> int:
        return sum(pq.read_metadata(p).num_rows for p in self.parts(table))

    def has_layer(self, layer: str) -> bool:
        return layer in self.layers

    def scan(self, table: str) -> pl.LazyFrame:
        """A typed LazyFrame over all parts of `table` (empty and typed when none)."""
        t = schema.table(_check_table(table))
        parts = self.parts(table)
        if not parts:
            return pl.LazyFrame(schema=t.polars_schema)
        # Parts written before a nullable column was added read it as nulls.
        return pl.scan_parquet([str(p) for p in parts], schema=t.polars_schema,
                               missing_columns="insert").select(
            [pl.col(n).cast(dt) for n, dt in t.polars_schema.items()]
        )

    def validate(self) -> None:
        """Read every part's footer; raise TraceError naming the first bad part."""
        for name in schema.TABLES:
            for p in self.parts(name):
                _check_part(schema.table(name), p)


def _check_table(table: str) -> str:
    if table not in schema.TABLES:
        known = ", ".join(schema.TABLES)
        raise TraceError(f"unknown table {table!r} (tables: {known})")
    return table


def _check_part(t: schema.Table, path: Path) -> None:
    try:
        meta = pq.read_metadata(path)
        arrow_schema = meta.schema.to_arrow_schema()
    except (OSError, pa.ArrowException) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise TraceError(f"corrupt Parquet part {path}: {reason}") from None
    version = int((arrow_schema.metadata or {}).get(b"gputrace.schema_version", b"0"))
    if version > schema.SCHEMA_VERSION:
        raise TraceError(
            f"{path} has schema version {version}, newer than this gputrace "
            f"({schema.SCHEMA_VERSION}); upgrade gputrace"
        )
    missing = [c.name for c in t.columns if c.name not in arrow_schema.names
               and not c.nullable]
    if missing:
        raise TraceError(f"{path}: columns missing from table {t.name}: {', '.join(missing)}")


def open_trace(path: str | os.PathLike[str], *, validate: bool = True) -> Trace:
    """Open a trace directory; raises `TraceError` with a one-line reason."""
    p = Path(path)
    if not p.exists():
        raise TraceError(f"{p}: no such trace directory")
    if not p.is_dir():
        raise TraceError(f"{p} is not a trace directory (it is a file)")
    mpath = p / MANIFEST
    if not mpath.exists():
        raise TraceError(f"{p} is not a gputrace trace (no {MANIFEST})")
    try:
        manifest = json.loads(mpath.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TraceError(f"{mpath}: unreadable manifest ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise TraceError(f"{mpath} is not a gputrace manifest")
    fv = manifest.get("format_version")
    if not isinstance(fv, int):
        raise TraceError(f"{mpath}: format_version missing or not an integer")
    if fv > FORMAT_VERSION:
        raise TraceError(
            f"{p} uses trace format {fv}, newer than this gputrace reads ({FORMAT_VERSION}); "
            "upgrade gputrace"
        )
    trace = Trace(p, manifest)
    if validate:
        trace.validate()
    return trace


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


def collect_all(frames: Iterable[pl.LazyFrame]) -> list[pl.DataFrame]:
    """Collect several related queries in one pass (shared scans are deduplicated)."""
    return pl.collect_all(list(frames))
