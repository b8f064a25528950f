"""`gputrace convert`: decode the raw parts a `record --raw` trace holds into the
Parquet parts every reader expects, in place, on any machine (no root, no bcc).

Each raw part becomes the Parquet part of the same number, with the rows the
recorder would have written had it decoded them itself (the same decoder,
`decode.RAW_RECORDS`). A conversion cut short loses nothing and is resumed by
running it again: the Parquet part is renamed into place before its raw part is
removed, a raw part whose Parquet part exists is only removed, and the
manifest's row counts are taken from the parts on disk first.

A recording whose recorder was killed also left the rows of processes still
running then (`tracefiles.PENDING`): they become the table's next part, less any
row the parts already hold.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gputrace import schema
from gputrace.errors import TraceError
from gputrace.record import decode
from gputrace.trace import rawparts
from gputrace.trace.files import (
    MANIFEST,
    PART_RE,
    PENDING,
    abs_trace_path,
    lock_dir,
    lstat_at,
    open_dir_at,
    part_name,
    read_manifest,
    reason,
)
from gputrace.trace.reader import in_current_schema
from gputrace.trace.writer import stream_part, write_manifest, write_part

__all__ = ["Converted", "convert"]



@dataclass
class Converted:
    """What one `convert` did."""

    parts: int = 0  # raw parts decoded
    rows: int = 0  # rows written
    skipped: int = 0  # records skipped as unreadable (added to decode_errors)
    tables: list[str] = field(default_factory=list)  # tables that held raw parts
    pending: int = 0  # rows of things still in progress when a recorder was killed, kept


def convert(path: str | os.PathLike[str], *, level: int = 3, jobs: int = 1) -> Converted:
    """Decode every raw part of the trace at `path` into Parquet, in place, `jobs`
    parts at a time."""
    root = abs_trace_path(path)
    if not root.is_dir():
        raise TraceError(f"{root}: no such trace directory")
    fd = open_dir_at(None, root, root)
    try:
        lock_dir(fd, root)
        manifest = read_manifest(fd, MANIFEST, root / MANIFEST)
        done = Converted()
        for table in schema.TABLES:
            announced = manifest.get("tables", {}).get(table, {})
            folder = _folder(fd, root, table)
            if folder is None:
                continue
            try:
                _fold_pending(fd, folder, root, table, manifest, done)
                raws = _raw_parts(folder)
                if not raws and "raw_parts" not in announced:
                    continue
                _convert_table(fd, folder, root, table, raws, manifest, done, level, jobs)
            finally:
                os.close(folder)
        return done
    finally:
        os.close(fd)


def _folder(fd: int, root: Path, table: str) -> int | None:
    st = None
    with contextlib.suppress(OSError):
        st = os.stat(table, dir_fd=fd, follow_symlinks=False)
    if st is None or not stat.S_ISDIR(st.st_mode):
        return None
    return open_dir_at(fd, table, root / table)


PENDING_KEYS = {"processes": ("pid", "start_ts_ns")}
"""Columns that name one row's subject: a PENDING row whose key a part already
holds is dropped (the recorder wrote its final row, then was killed before it
removed PENDING)."""


def _fold_pending(fd: int, folder: int, root: Path, table: str, manifest: dict[str, Any],
                  done: Converted) -> None:  # fmt: skip
    """Make a table's PENDING rows (left by a killed recorder) its next part."""
    st = lstat_at(folder, PENDING)
    if st is None:
        return
    where = root / table / PENDING
    if not stat.S_ISREG(st.st_mode):
        raise TraceError(f"{where}: not a regular file")
    t = schema.table(table)
    data = _read(folder, PENDING, where)
    try:
        # left by a recorder of an older schema version too (nullable columns added
        # since read as nulls, as every reader reads its parts)
        got = in_current_schema(t, pq.read_table(pa.BufferReader(data)), where)
    except (pa.ArrowException, KeyError, ValueError) as e:
        raise TraceError(f"{where}: unreadable ({str(e).splitlines()[0]})") from None
    keys = PENDING_KEYS.get(table)
    names = sorted(os.listdir(folder))
    parts = [(int(m[1]), n) for n in names if (m := PART_RE.fullmatch(n)) and not m[3]]
    if keys is not None and got.num_rows:
        held: set[tuple[Any, ...]] = set()
        for _n, name in parts:
            if name.endswith(".parquet"):
                cols = pq.read_table(pa.BufferReader(_read(folder, name, root / table / name)),
                                     columns=list(keys)).to_pylist()  # fmt: skip
                held.update(tuple(r[k] for k in keys) for r in cols)
        rows = got.to_pylist()
        keep = [i for i, r in enumerate(rows) if tuple(r[k] for k in keys) not in held]
        got = got.take(pa.array(keep, pa.int64()))
    if got.num_rows:
        n = max((k for k, _ in parts), default=0) + 1
        write_part(folder, part_name(n), got, root / table)
    os.unlink(PENDING, dir_fd=folder)
    rows_now, parts_now = _count(folder, root / table)
    tables = manifest.setdefault("tables", {})
    tables[table] = {**tables.get(table, {}), "rows": rows_now, "parts": parts_now}
    write_manifest(fd, manifest, root)
    done.pending += got.num_rows


def _numbered(tables: dict[str, Any], table: str) -> dict[str, Any]:
    """`last_part` of a flight recording's table (its oldest parts deleted), kept."""
    last = tables.get(table, {}).get("last_part")
    return {} if last is None else {"last_part": last}


def _raw_parts(folder: int) -> list[tuple[int, str]]:
    return sorted((int(m[1]), n) for n in os.listdir(folder)
                  if (m := PART_RE.fullmatch(n)) and m[2] == "gtraw" and not m[3])  # fmt: skip


def _convert_table(fd: int, folder: int, root: Path, table: str, raws: list[tuple[int, str]],
                   manifest: dict[str, Any], done: Converted, level: int,
                   jobs: int) -> None:  # fmt: skip
    where = root / table
    names = set(os.listdir(folder))
    left = []
    for n, name in raws:  # cut short after its Parquet part was renamed into place
        if part_name(n) in names:
            os.unlink(name, dir_fd=folder)
        else:
            left.append((n, name))
    rows, parts = _count(folder, where)
    tables = manifest.setdefault("tables", {})
    errors = manifest.setdefault("decode_errors", {})
    # parts are decoded and written side by side (numpy, Arrow, zstd and Parquet
    # release the GIL); each is then recorded in order: its raw part removed, the
    # manifest rewritten, so an interruption leaves a trace `convert` resumes
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        futures = [pool.submit(_part, folder, n, name, where, table, level)
                   for n, name in left]  # fmt: skip
        try:
            for i, ((_n, name), fut) in enumerate(zip(left, futures, strict=True)):
                got, skipped, buffer = fut.result()
                os.unlink(name, dir_fd=folder)
                rows, parts = rows + got, parts + 1
                done.parts, done.rows, done.skipped = (done.parts + 1, done.rows + got,
                                                       done.skipped + skipped)  # fmt: skip
                errors[buffer] = int(errors.get(buffer, 0)) + skipped
                tables[table] = {**_numbered(tables, table), "rows": rows, "parts": parts}
                if i + 1 < len(left):
                    tables[table].update(raw_parts=len(left) - i - 1)
                write_manifest(fd, manifest, root)
        finally:
            for fut in futures:
                fut.cancel()
    if not left:  # only leftovers of a conversion cut short: counts from the parts
        tables[table] = {**_numbered(tables, table), "rows": rows, "parts": parts}
    manifest["converted"] = {"gputrace_version": _version(), "unix_s": time.time()}
    write_manifest(fd, manifest, root)
    done.tables.append(table)


def _spec(meta: dict[str, Any], table: str, where: str) -> decode.RawRecord:
    spec = decode.RAW_RECORDS.get(str(meta.get("record")))
    if spec is None or meta.get("table") != table or spec.table != table:
        raise TraceError(f"{where}: raw {meta.get('record')!r} records of table "
                         f"{meta.get('table')!r}, which this gputrace does not decode")  # fmt: skip
    if meta.get("itemsize") != spec.dtype.itemsize or meta.get("fields") != rawparts.layout(
        spec.dtype
    ):
        raise TraceError(f"{where}: {spec.record} records of another layout than this "
                         "gputrace's; convert with the version that recorded it")  # fmt: skip
    return spec


def _part(folder: int, n: int, name: str, where: Path, table: str,
          level: int) -> tuple[int, int, str]:  # fmt: skip
    """Decode raw part `name` and write it as Parquet part `n`: (rows, skipped, the
    decode_errors key). Each frame is decoded as the recorder would have decoded
    that work item (sorted by time within it), one frame at a time."""
    at = str(where / name)
    meta, frames = rawparts.read(_read(folder, name, where / name), at)
    spec = _spec(meta, table, at)
    skipped = 0

    def batches() -> Iterator[pa.RecordBatch]:
        nonlocal skipped
        for frame in frames:
            batch, bad = spec.decode(np.frombuffer(rawparts.records(frame, at), spec.dtype))
            skipped += bad
            if batch is not None:
                yield batch

    rows = stream_part(folder, part_name(n), where, schema.table(table), batches(),
                       level)
    return rows, skipped, spec.buffer


def _count(folder: int, where: Path) -> tuple[int, int]:
    """Rows and Parquet parts a table folder holds (from the footers)."""
    rows = parts = 0
    for name in sorted(os.listdir(folder)):
        if (m := PART_RE.fullmatch(name)) and m[2] == "parquet" and not m[3]:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
            with os.fdopen(fd, "rb") as f:
                try:
                    rows += pq.read_metadata(f).num_rows
                except (pa.ArrowException, OSError) as e:
                    raise TraceError(f"{where / name}: unreadable part ({e})") from None
            parts += 1
    return rows, parts


def _read(folder: int, name: str, where: Path) -> bytes:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=folder)  # fmt: skip
    except OSError as e:
        raise TraceError(f"{where}: unreadable raw part ({reason(e)})") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise TraceError(f"{where}: not a regular file")
        return f.read()


def _version() -> str:
    from gputrace import __version__

    return __version__
