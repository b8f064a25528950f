"""The trace directory: a manifest plus rotated Parquet parts per table.

Layout::

    <trace>/manifest.json
    <trace>/<table>/part-000001.parquet ...

Writes are crash-safe: every part and every manifest is written to a `*.tmp`
file and renamed into place, so a recorder killed with SIGKILL leaves a trace
that reads back, with status `recording`, missing at most the rows buffered
since the last rotation. Readers list parts from the directory, not from the
manifest, so a part renamed just before the kill is not lost either.

Writes are also safe against other users (the recorder runs as root, often in
a shared /tmp): the writer opens the trace directory once, refuses one that is
a link, owned by someone else or writable by group/others, and creates every
file relative to that descriptor with O_CREAT|O_EXCL|O_NOFOLLOW, so no link is
ever followed and no existing file is ever truncated. docs/security.md has the
whole story, including what `--force` deletes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from gputrace import schema
from gputrace.errors import TraceError

if TYPE_CHECKING:  # polars is imported where a scan needs it: recording never does
    import polars as pl

FORMAT_NAME = schema.FORMAT_NAME
FORMAT_VERSION = schema.FORMAT_VERSION

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MANIFEST",
    "STATUS_COMPLETE",
    "STATUS_RECORDING",
    "Trace",
    "TraceWriter",
    "check_output",
    "open_trace",
    "trace_warnings",
    "write_tables",
]

MANIFEST = "manifest.json"
MANIFEST_TMP = MANIFEST + ".tmp"
PART_GLOB = "part-*.parquet"
_PART_RE = re.compile(r"part-(\d+)\.parquet(\.tmp)?")

STATUS_RECORDING = "recording"
STATUS_COMPLETE = "complete"

_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_O_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CREATE_TRIES = 3


def _part_name(n: int) -> str:
    return f"part-{n:06d}.parquet"


def _stderr_note(message: str) -> None:
    print(f"gputrace: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- safe files
def _reason(e: OSError) -> str:
    return e.strerror or type(e).__name__


def _open_dir_at(dir_fd: int | None, name: str | Path, where: Path) -> int:
    """Open a directory without following a link in its last component."""
    try:
        return os.open(name, _O_DIR, dir_fd=dir_fd)
    except OSError as e:
        st = _lstat_at(dir_fd, name)
        if st is not None and stat.S_ISLNK(st.st_mode):
            raise TraceError(f"{where} is a symbolic link; refusing to write through it") from None
        if st is not None and not stat.S_ISDIR(st.st_mode):
            raise TraceError(f"{where} exists and is not a directory") from None
        raise TraceError(f"{where}: cannot open ({_reason(e)})") from None


def _lstat_at(dir_fd: int | None, name: str | Path) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _check_private(fd: int, where: Path) -> None:
    """Refuse a directory others could plant files in (see docs/security.md)."""
    st = os.fstat(fd)
    me = os.geteuid()
    if st.st_uid != me:
        raise TraceError(f"{where} is owned by uid {st.st_uid}, not by the recording user "
                         f"(uid {me}); refusing to write into it")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = "group and others" if st.st_mode & stat.S_IWGRP and st.st_mode & stat.S_IWOTH \
            else "group" if st.st_mode & stat.S_IWGRP else "others"
        raise TraceError(f"{where} is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o}); "
                         "refusing to write into it")


def _create(dir_fd: int, name: str, where: Path) -> int:
    """A new, empty 0600 file `name` in `dir_fd`; never follows or reuses an entry.

    The directory is private to us, so an entry already holding the name can only
    come from its owner or root; it is unlinked (unlink removes the entry, never
    what a link points to) and creation retried, so a recording goes on.
    """
    for _ in range(_CREATE_TRIES):
        try:
            fd = os.open(name, _O_NEW, 0o600, dir_fd=dir_fd)
        except FileExistsError:
            try:
                os.unlink(name, dir_fd=dir_fd)
            except FileNotFoundError:
                pass
            except OSError as e:
                raise TraceError(f"{where / name}: exists and cannot be replaced "
                                 f"({_reason(e)})") from None
            continue
        os.fchmod(fd, 0o600)  # exactly 0600 whatever the umask
        return fd
    raise TraceError(f"{where / name}: something keeps creating this name; refusing to write")


@dataclass
class _Plan:
    """What `--force` will delete in an existing trace directory, and what it keeps."""

    remove: list[tuple[str | None, str]] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)


def _abs(path: str | os.PathLike[str]) -> Path:
    p = Path(os.path.abspath(path))
    if p == p.parent:
        raise TraceError(f"{p} cannot be a trace directory")
    return p


def _manifest_model() -> ModuleType:
    """The pydantic manifest model, imported on first use: the recorder's write path
    never validates a manifest, and production hosts need not install pydantic."""
    from gputrace import manifest

    return manifest


def check_output(path: str | os.PathLike[str], *, force: bool = False) -> None:
    """Would `TraceWriter(path, force=force)` refuse? Raises its TraceError; changes nothing.

    For the recorder, to refuse a bad `-o` before it starts anything.
    """
    p = _abs(path)
    try:
        parent_fd = os.open(p.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return  # created by the writer
    except OSError as e:
        raise TraceError(f"{p.parent}: cannot open ({_reason(e)})") from None
    try:
        st = _lstat_at(parent_fd, p.name)
        if st is None:
            return
        fd = _open_existing(parent_fd, p, st, force)
        try:
            _plan_removal(fd, p)
        finally:
            os.close(fd)
    finally:
        os.close(parent_fd)


def _open_existing(parent_fd: int, p: Path, st: os.stat_result, force: bool) -> int:
    if stat.S_ISLNK(st.st_mode):
        raise TraceError(f"{p} is a symbolic link; refusing to write through it "
                         "(give the directory's real path)")
    if not force:
        raise TraceError(f"{p} already exists (use --force to overwrite)")
    if not stat.S_ISDIR(st.st_mode):
        raise TraceError(f"{p} exists and is not a trace; refusing to overwrite")
    fd = _open_dir_at(parent_fd, p.name, p)
    try:
        _check_private(fd, p)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_output(p: Path, force: bool, note: Callable[[str], None]) -> int:
    """The trace directory's descriptor: created 0700, or an old trace emptied (--force)."""
    try:
        os.makedirs(p.parent, exist_ok=True)
        parent_fd = os.open(p.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise TraceError(f"{p.parent}: cannot create or open ({_reason(e)})") from None
    try:
        st = _lstat_at(parent_fd, p.name)
        if st is None:
            try:
                os.mkdir(p.name, 0o700, dir_fd=parent_fd)
            except FileExistsError:
                raise TraceError(f"{p} appeared while gputrace was creating it; "
                                 "refusing to write into it") from None
            except OSError as e:
                raise TraceError(f"{p}: cannot create ({_reason(e)})") from None
            fd = _open_dir_at(parent_fd, p.name, p)
            try:
                # swapped between mkdir and open (for someone else's directory, or one
                # of ours with content): what we opened must be what we just made
                _check_private(fd, p)
                if os.listdir(fd):
                    raise TraceError(f"{p} was replaced while gputrace was creating it; "
                                     "refusing to write into it")
            except BaseException:
                os.close(fd)
                raise
        else:
            fd = _open_existing(parent_fd, p, st, force)
            try:
                _remove(fd, p, _plan_removal(fd, p), note)
            except BaseException:
                os.close(fd)
                raise
    finally:
        os.close(parent_fd)
    os.fchmod(fd, 0o700)
    return fd


def _plan_removal(fd: int, p: Path) -> _Plan:
    """What `--force` may delete: only files the old manifest says gputrace wrote.

    An empty directory is reused as is. Otherwise it must hold a valid gputrace
    manifest; then the manifest, the parts it lists (for an unfinished recording,
    also the one part and temporary files the writer may have made after its last
    manifest) go, and table folders left empty. Part-like files the manifest does
    not list would be read as part of the new trace, so they make `--force`
    refuse, deleting nothing; any other file is kept (and reported).
    """
    entries = sorted(os.listdir(fd))
    plan = _Plan()
    if not entries:
        return plan
    if MANIFEST not in entries:
        raise TraceError(f"{p} exists and is not a trace (no {MANIFEST}); refusing to overwrite")
    try:
        manifest_model = _manifest_model()
        raw = manifest_model.parse(_read_at(fd, MANIFEST, p / MANIFEST), str(p / MANIFEST))
    except TraceError as e:
        raise TraceError(f"{p} exists and is not a trace we can replace ({e}); "
                         "refusing to overwrite") from None
    listed: dict[str, int] = {t: int(v["parts"]) for t, v in raw.get("tables", {}).items()}
    unknown = sorted(set(listed) - set(schema.TABLES))
    if unknown:
        raise TraceError(f"{p}: its manifest lists table {unknown[0]!r}, unknown to this "
                         "gputrace; refusing to overwrite")
    finished = raw.get("status") == STATUS_COMPLETE
    refuse: list[str] = []
    for name in entries:
        st = _lstat_at(fd, name)
        if st is None:
            continue
        if name in (MANIFEST, MANIFEST_TMP):
            (plan.remove.append((None, name)) if stat.S_ISREG(st.st_mode)
             else refuse.append(name))
        elif name in schema.TABLES:
            if not stat.S_ISDIR(st.st_mode):
                refuse.append(name)
                continue
            last = listed.get(name, 0) + (0 if finished else 1)
            tfd = _open_dir_at(fd, name, p / name)
            try:
                _check_private(tfd, p / name)
                for sub in sorted(os.listdir(tfd)):
                    sst = _lstat_at(tfd, sub)
                    m = _PART_RE.fullmatch(sub)
                    ours = (m is not None and sst is not None and stat.S_ISREG(sst.st_mode)
                            and sub == _part_name(int(m[1])) + (m[2] or "")
                            and 1 <= int(m[1]) <= last
                            and (m[2] is None or (int(m[1]) == last and not finished)))
                    if ours:
                        plan.remove.append((name, sub))
                    elif m is not None or sub.endswith(".parquet"):
                        refuse.append(f"{name}/{sub}")
                    else:
                        plan.kept.append(f"{name}/{sub}")
            finally:
                os.close(tfd)
        else:
            plan.kept.append(name)
    if refuse:
        more = f" (+{len(refuse) - 3} more)" if len(refuse) > 3 else ""
        raise TraceError(
            f"--force replaces only what {p}/{MANIFEST} lists, but "
            f"{', '.join(repr(r) for r in refuse[:3])}{more} "
            f"{'is' if len(refuse) == 1 else 'are'} not listed there; refusing, nothing deleted"
        )
    return plan


def _remove(fd: int, p: Path, plan: _Plan, note: Callable[[str], None]) -> None:
    folders = sorted({t for t, _ in plan.remove if t is not None})
    for t in folders:
        tfd = _open_dir_at(fd, t, p / t)
        try:
            for table, name in plan.remove:
                if table == t:
                    os.unlink(name, dir_fd=tfd)
        finally:
            os.close(tfd)
        with contextlib.suppress(OSError):  # holds files gputrace did not write: kept
            os.rmdir(t, dir_fd=fd)
    # The manifest last: interrupted before this, the directory is still a trace.
    for table, name in sorted(plan.remove, key=lambda x: x[1] == MANIFEST):
        if table is None:
            os.unlink(name, dir_fd=fd)
    if plan.kept:
        more = f" (+{len(plan.kept) - 5} more)" if len(plan.kept) > 5 else ""
        note(f"note: --force kept {len(plan.kept)} entries of {p} that gputrace did not "
             f"write: {', '.join(repr(k) for k in plan.kept[:5])}{more}")


def _read_at(dir_fd: int | None, name: str | Path, where: Path) -> bytes:
    """A small regular file's bytes (non-blocking open: a FIFO must not hang us)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as e:
        raise TraceError(f"{where}: unreadable manifest ({_reason(e)})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise TraceError(f"{where}: unreadable manifest (not a regular file)")
        chunks = []
        manifest_model = _manifest_model()
        left = manifest_model.MAX_BYTES + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError as e:
        raise TraceError(f"{where}: unreadable manifest ({_reason(e)})") from None
    finally:
        os.close(fd)


# ---------------------------------------------------------------- writer
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
        self._fd = _open_output(_abs(path), force, self._note)
        self._table_fds: dict[str, int] = {}
        self.rotate_rows = rotate_rows
        self.compression_level = compression_level
        self._buffers: dict[str, list[pa.RecordBatch]] = {n: [] for n in schema.TABLES}
        self._buffered_rows: dict[str, int] = dict.fromkeys(schema.TABLES, 0)
        self._parts: dict[str, int] = dict.fromkeys(schema.TABLES, 0)
        self._rows: dict[str, int] = dict.fromkeys(schema.TABLES, 0)
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
        """Write what is buffered and the final manifest; release the directory."""
        for name in schema.TABLES:
            if self._buffered_rows[name]:
                self._flush_table(name)
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
        fd = _open_dir_at(self._fd, name, self.path / name)
        try:
            _check_private(fd, self.path / name)
            os.fchmod(fd, 0o700)
        except BaseException:
            os.close(fd)
            raise
        self._table_fds[name] = fd
        return fd

    def _flush_table(self, name: str) -> None:
        t = schema.table(name)
        arrow = pa.Table.from_batches(self._buffers[name], schema=t.arrow_schema)
        folder = self._table_dir(name)
        final = _part_name(self._parts[name] + 1)
        tmp = final + ".tmp"
        with os.fdopen(_create(folder, tmp, self.path / name), "wb") as f:
            # A file object, not a path: pyarrow never opens anything by name here.
            pq.write_table(
                arrow,
                f,
                compression="zstd",
                compression_level=self.compression_level,
                use_dictionary=True,
                write_statistics=True,
            )
        # rename replaces a directory entry; it never writes through a link planted there
        os.rename(tmp, final, src_dir_fd=folder, dst_dir_fd=folder)
        self._parts[name] += 1
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
        fd = _create(self._fd, MANIFEST_TMP, self.path)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(MANIFEST_TMP, MANIFEST, src_dir_fd=self._fd, dst_dir_fd=self._fd)
        os.fsync(self._fd)


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


# ---------------------------------------------------------------- reader
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

    def scan(self, table: str) -> pl.LazyFrame:
        """A typed LazyFrame over all parts of `table` (empty and typed when none)."""
        import polars as pl

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

    def warnings(self) -> list[str]:
        """See `trace_warnings` (computed once per Trace)."""
        if self._warnings is None:
            self._warnings = _integrity_warnings(self)
        return list(self._warnings)


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
    missing = [c.name for c in t.columns if c.name not in arrow_schema.names
               and not c.nullable]
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
    manifest_model = _manifest_model()
    manifest = manifest_model.parse(_read_at(None, mpath, mpath), str(mpath))
    trace = Trace(p, manifest)
    if validate:
        trace.validate()
    return trace


# ---------------------------------------------------------------- integrity
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
    for name in sorted(set(announced) - set(schema.TABLES)):
        out.append(f"the manifest lists table {name!r}, unknown to this gputrace; ignored")
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


def _outside(parts: list[Path], start: int | None, end: int | None) -> int:
    """Rows of `parts` with ts_ns outside [start, end]; footers first, data only if needed."""
    suspect = []
    for p in parts:
        meta = pq.read_metadata(p)
        names = [meta.schema.column(i).path for i in range(meta.num_columns)]
        if "ts_ns" not in names:
            continue
        col = names.index("ts_ns")
        for rg in range(meta.num_row_groups):
            st = meta.row_group(rg).column(col).statistics
            lo, hi = (st.min, st.max) if st is not None and st.has_min_max else (None, None)
            if (lo is None or hi is None
                    or (start is not None and lo < start)
                    or (end is not None and hi > end)):
                suspect.append(p)
                break
    if not suspect:
        return 0
    import polars as pl

    ts = pl.col("ts_ns")
    lo = ts < start if start is not None else pl.lit(False)
    hi = ts > end if end is not None else pl.lit(False)
    return int(pl.scan_parquet([str(p) for p in suspect]).select(ts.cast(pl.Int64))
               .filter(lo | hi).select(pl.len()).collect().item())


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
