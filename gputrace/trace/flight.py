"""The flight recorder's writer (`record --keep`, `--freeze-on`): a TraceWriter
that deletes the parts out of its window and freezes incidents.

Every part written is booked (`window.Part`). At each manifest rewrite (each
rotation) the parts out of the window are dropped from the books, the manifest
saying so (`tables` counts what is held, `window` what was deleted) is written
atomically, and only then are their files unlinked: a reader, or a recorder
killed in between, never finds the manifest announcing a part that is gone.

An incident (`freeze`) is a trace directory of its own, INCIDENTS/STAMP-TRIGGER
inside the trace: every part held when it fires and every part written until
`after` past it are hard-linked into it (copied across file systems), so
deleting them from the flight trace deletes nothing of the incident; its
manifest is written once, complete, with `window` {from, to, trigger}.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from gputrace import schema
from gputrace.trace import rawparts
from gputrace.trace.files import (
    PENDING,
    STATUS_COMPLETE,
    STATUS_RECORDING,
    open_dir_at,
    part_name,
)
from gputrace.trace.window import TIME_COLUMN, Held, Keep, Part
from gputrace.trace.writer import TraceWriter, write_manifest, write_part

INCIDENTS = "incidents"
"""The folder of a flight trace holding its incident traces."""
MAX_INCIDENTS = 64
"""Incidents kept per recording at most (each holds a window): later ones are
counted in the manifest (`incidents_dropped`), not kept."""


@dataclass
class FrozenWindow:
    """One incident trace being filled: the parts linked so far, until `to_ns`."""

    name: str
    trigger: str
    at_ns: int
    to_ns: int
    detail: dict[str, Any]
    fd: int
    parts: list[Part] = field(default_factory=list)
    tables: dict[str, int] = field(default_factory=dict)  # table -> its folder fd
    events: int = 1  # triggers that fired while it was open

    def folder(self, table: str) -> int:
        fd = self.tables.get(table)
        if fd is None:
            with contextlib.suppress(FileExistsError):
                os.mkdir(table, 0o700, dir_fd=self.fd)
            fd = self.tables[table] = open_dir_at(self.fd, table, self._where(table))
        return fd

    def link(self, src: int, part: Part) -> None:
        """Hard-link (or, across file systems, copy) `part` from the folder `src`."""
        dst = self.folder(part.table)
        try:
            os.link(part.name, part.name, src_dir_fd=src, dst_dir_fd=dst,
                    follow_symlinks=False)  # fmt: skip
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                raise
            _copy(src, dst, part.name)
        self.parts.append(part)

    def close(self) -> None:
        for fd in [*self.tables.values(), self.fd]:
            os.close(fd)
        self.tables = {}

    def _where(self, table: str) -> Any:
        return f"{INCIDENTS}/{self.name}/{table}"


def _copy(src: int, dst: int, name: str) -> None:
    fin = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=src)
    with os.fdopen(fin, "rb") as r:
        fout = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                       | os.O_CLOEXEC, 0o600, dir_fd=dst)  # fmt: skip
        with os.fdopen(fout, "wb") as w:
            shutil.copyfileobj(r, w)


def _span(batches: list[pa.RecordBatch], column: str) -> tuple[int | None, int | None]:
    lo: int | None = None
    hi: int | None = None
    for b in batches:
        if column not in b.schema.names:
            return None, None
        mm = pc.min_max(b.column(column))
        a, z = mm["min"].as_py(), mm["max"].as_py()
        if a is not None:
            lo = a if lo is None else min(lo, a)
            hi = z if hi is None else max(hi, z)
    return lo, hi


class FlightWriter(TraceWriter):
    """A TraceWriter that keeps a window (`keep`, None: everything) and freezes
    incidents; `grace_ns`: how long after an incident's end its last events may
    still be on their way to the writer (one rotation)."""

    def __init__(self, path: str | os.PathLike[str], *, keep: Keep | None,
                 grace_ns: int, rotate_s: float, **kw: Any) -> None:  # fmt: skip
        self.held = Held(keep)
        self.grace_ns = grace_ns
        self.rotate_s = rotate_s
        self.incidents: list[FrozenWindow] = []  # open ones
        self.kept: list[dict[str, Any]] = []  # every incident, for the manifest
        self.incidents_dropped = 0
        self._raw_span: dict[str, tuple[int, int]] = {}
        self._incidents_fd = -1
        super().__init__(path, **kw)

    # ------------------------------------------------------------ parts written
    def append_raw(self, table: str, record: str, dtype: np.dtype[Any],
                   data: bytes | memoryview) -> None:  # fmt: skip
        n = len(data) // dtype.itemsize
        if n and "ts_ns" in (dtype.names or ()):
            ts = np.frombuffer(data, dtype, n)["ts_ns"]
            lo, hi = int(ts.min()), int(ts.max())
            old = self._raw_span.get(table, (lo, hi))
            self._raw_span[table] = (min(lo, old[0]), max(hi, old[1]))
        super().append_raw(table, record, dtype, data)

    def _flush_table(self, name: str) -> None:
        first, last = _span(self._buffers[name], TIME_COLUMN.get(name, "ts_ns"))
        rows = self._buffered_rows[name]
        super()._flush_table(name)
        self._booked(name, part_name(self._parts[name] + self._raw_parts[name]), rows,
                     first, last, raw=False)  # fmt: skip

    def _flush_raw(self, name: str) -> None:
        rows = self._raw_buffered[name]
        first, last = self._raw_span.pop(name, (None, None))
        super()._flush_raw(name)
        n = self._parts[name] + self._raw_parts[name]
        self._booked(name, rawparts.raw_part_name(n), rows, first, last, raw=True)

    def _booked(self, table: str, name: str, rows: int, first: int | None,
                last: int | None, *, raw: bool) -> None:  # fmt: skip
        folder = self._table_dir(table)
        size = os.stat(name, dir_fd=folder, follow_symlinks=False).st_size
        part = Part(table, name, rows, size, first, last, raw)
        self.held.add(part)
        for inc in list(self.incidents):
            self._guarded(inc, lambda i=inc: i.link(folder, part))

    # ------------------------------------------------------------ manifest, deletion
    def _write_manifest(self) -> None:
        doomed = self.held.expire()
        tables = self.held.tables()
        for t in schema.TABLES:  # the numbers used: `--force` knows the deleted ones' names
            n = self._parts[t] + self._raw_parts[t]
            if n:
                tables.setdefault(t, {"rows": 0, "parts": 0})["last_part"] = n
        self.manifest["tables"] = tables
        if self.held.keep is not None:
            self.manifest["window"] = self.held.manifest(self.rotate_s)
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        for inc in list(self.incidents):
            if now >= inc.to_ns + self.grace_ns or self.manifest["status"] != STATUS_RECORDING:
                self._guarded(inc, lambda i=inc: self._seal(i))
        if self.kept or self.incidents_dropped:
            self.manifest["incidents"] = self.kept
            self.manifest["incidents_dropped"] = self.incidents_dropped
        write_manifest(self._fd, self.manifest, self.path)
        for p in doomed:  # after the manifest that no longer announces them
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p.name, dir_fd=self._table_dir(p.table))

    def close(self, status: str = STATUS_COMPLETE) -> None:
        self.manifest["status"] = status  # seals the open incidents at the last rewrite
        super().close(status)

    # ------------------------------------------------------------ incidents
    def freeze(self, trigger: str, at_ns: int, after_ns: int,
               detail: Mapping[str, Any] | None = None) -> str | None:  # fmt: skip
        """An incident fired at `at_ns` (CLOCK_MONOTONIC): keep what is held now and
        what comes until `after_ns` past it as an incident trace; returns its folder
        (relative to the trace), or None when one is open already (it counts this
        one) or MAX_INCIDENTS were kept."""
        for inc in self.incidents:
            if at_ns <= inc.to_ns:
                inc.events += 1
                return None
        if len(self.kept) >= MAX_INCIDENTS:
            self.incidents_dropped += 1
            return None
        try:
            inc = self._open_incident(trigger, at_ns, after_ns, dict(detail or {}))
        except OSError as e:
            self._note(f"warning: incident {trigger} not kept: {e.strerror or e}; "
                       "recording goes on")  # fmt: skip
            return None
        self.incidents.append(inc)
        self.kept.append({"dir": f"{INCIDENTS}/{inc.name}", "trigger": trigger,
                          "ts_ns": at_ns, "status": "open"})  # fmt: skip
        for part in list(self.held.parts):
            self._guarded(inc, lambda p=part: inc.link(self._table_dir(p.table), p))
        self._note(f"incident {trigger}: the window before it and {after_ns / 1e9:g} s after "
                   f"it go to {self.path / INCIDENTS / inc.name}")  # fmt: skip
        return f"{INCIDENTS}/{inc.name}"

    def _open_incident(self, trigger: str, at_ns: int, after_ns: int,
                       detail: dict[str, Any]) -> FrozenWindow:  # fmt: skip
        if self._incidents_fd < 0:
            with contextlib.suppress(FileExistsError):
                os.mkdir(INCIDENTS, 0o700, dir_fd=self._fd)
            self._incidents_fd = open_dir_at(self._fd, INCIDENTS, self.path / INCIDENTS)
        stamp = time.strftime("%Y-%m-%dT%H-%M-%SZ", time.gmtime())
        name = f"{stamp}-{trigger}"
        for i in range(2, 1000):
            try:
                os.mkdir(name, 0o700, dir_fd=self._incidents_fd)
                break
            except FileExistsError:
                name = f"{stamp}-{trigger}-{i}"
        fd = open_dir_at(self._incidents_fd, name, self.path / INCIDENTS / name)
        return FrozenWindow(name, trigger, at_ns, at_ns + after_ns, detail, fd)

    def _seal(self, inc: FrozenWindow) -> None:
        """The incident's still-running processes and its manifest, written once."""
        self.incidents.remove(inc)
        self._pending_processes(inc)
        spans = [p for p in inc.parts if p.last_ns is not None]
        first = min((p.first_ns or 0 for p in spans), default=None)
        last = max((p.last_ns or 0 for p in spans), default=None)
        tables: dict[str, Any] = {}
        for p in inc.parts:
            t = tables.setdefault(p.table, {"rows": 0, "parts": 0})
            key = ("raw_records", "raw_parts") if p.raw else ("rows", "parts")
            t[key[0]] = t.get(key[0], 0) + p.rows
            t[key[1]] = t.get(key[1], 0) + 1
        m = {k: v for k, v in self.manifest.items()
             if k not in ("window", "incidents", "incidents_dropped")}  # fmt: skip
        m.update(status=STATUS_COMPLETE, tables=tables, start_ts_ns=first, end_ts_ns=last,
                 window={"from_ts_ns": first, "to_ts_ns": inc.to_ns, "trigger": inc.trigger,
                         "incident_ts_ns": inc.at_ns, "events": inc.events,
                         "detail": inc.detail, "deleted_before": self.held.from_ns,
                         "flight_trace_id": m.get("trace_id")})
        if "trace_id" in m:  # a trace of its own: `gputrace export` files it apart
            m["trace_id"] = str(uuid.uuid4())
        write_manifest(inc.fd, m, self.path / INCIDENTS / inc.name)
        inc.close()
        for k in self.kept:
            if k["dir"] == f"{INCIDENTS}/{inc.name}":
                k["status"] = "kept"

    def _pending_processes(self, inc: FrozenWindow) -> None:
        """Processes still running at the seal have no row in a part yet: their
        PENDING rows become the incident's last processes part."""
        if "processes" not in self._pending:
            return
        src = self._table_dir("processes")
        try:
            got = pq.read_table(pa.BufferReader(_read_at(src, PENDING)))
        except FileNotFoundError:
            return
        have: set[tuple[Any, Any]] = set()
        for p in inc.parts:
            if p.table == "processes":
                rows = pq.read_table(pa.BufferReader(_read_at(inc.folder("processes"), p.name)),
                                     columns=["pid", "start_ts_ns"]).to_pylist()  # fmt: skip
                have.update((r["pid"], r["start_ts_ns"]) for r in rows)
        keep = [i for i, r in enumerate(got.select(["pid", "start_ts_ns"]).to_pylist())
                if (r["pid"], r["start_ts_ns"]) not in have]  # fmt: skip
        if not keep:
            return
        got = got.take(pa.array(keep, pa.int64())).cast(schema.PROCESSES.arrow_schema)
        n = self._parts["processes"] + self._raw_parts["processes"] + 1
        name = part_name(n)
        write_part(inc.folder("processes"), name, got, self.path / INCIDENTS / inc.name)
        inc.parts.append(Part("processes", name, got.num_rows, 0, None, None))

    def _guarded(self, inc: FrozenWindow, step: Any) -> None:
        """An incident that cannot be written (disk full) is given up with one line;
        the recording and what it holds go on."""
        try:
            step()
        except OSError as e:
            if inc in self.incidents:
                self.incidents.remove(inc)
            with contextlib.suppress(OSError):
                inc.close()
            for k in self.kept:
                if k["dir"] == f"{INCIDENTS}/{inc.name}":
                    k["status"] = "failed"
            self._note(f"warning: incident {INCIDENTS}/{inc.name} given up: "
                       f"{e.strerror or e}; recording goes on")  # fmt: skip

    def _close_fds(self) -> None:
        for inc in self.incidents:
            with contextlib.suppress(OSError):
                inc.close()
        if self._incidents_fd >= 0:
            os.close(self._incidents_fd)
            self._incidents_fd = -1
        super()._close_fds()


def _read_at(folder: int, name: str) -> bytes:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
    with os.fdopen(fd, "rb") as f:
        return f.read()
