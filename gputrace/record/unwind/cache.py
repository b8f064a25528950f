"""Compiled unwind tables kept across recordings on one host.

A library's table depends only on the file: compiled once (pyelftools, seconds for a
large library: docs/record.md), it is kept under `GPUTRACE_UNWIND_CACHE` (default
/var/cache/gputrace/unwind; "off": none), keyed by the file's identity (device, inode,
size, modification and change times) and the row bound. A refusal that depends only on
the file ("more than N unwind rows", no CFI, not x86-64) is kept too, so a PyTorch
library over the bound costs its ~2 s once per host, not once per recording.

The directory is the recorder's (root's) alone: used only when it is a real directory
owned by the effective user and writable by nobody else, under parents that are real
directories owned by root or the effective user and writable by no one else (sticky
ones aside), from / down: no one else can rename or replace any part of its path
after the check; entries are written whole
(a temporary file renamed) and read back checked (types, order, bounds), and anything
that does not check is compiled again, never trusted. The recorder decides the
directory once (`cache_dir`, at the compile worker's start); the worker reads and
writes the entries (`compile_cached`). A library's identity and rows come from one
descriptor (fstat of the one it is read from): a name flipped between a stat and an
open cannot put one file's rows under another's key.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from gputrace.record.unwind import cfi

CACHE_ENV = "GPUTRACE_UNWIND_CACHE"
DEFAULT_DIR = "/var/cache/gputrace/unwind"
VERSION = 2  # of the entry format and of the compile's rules: a change makes new keys
MAX_ENTRY_BYTES = 16 << 20  # a table of 65,536 rows is ~2 MiB of JSON
_KEPT = ("unwind rows", "no .eh_frame or .debug_frame", "not x86-64", cfi.BOUND)
"""Refusals that depend on the file alone (kept); others (pyelftools missing, a read
error) may not recur and are not."""


def cache_dir() -> Path | None:
    """The cache directory to use, made if missing; None when off or not safe."""
    where = os.environ.get(CACHE_ENV, DEFAULT_DIR)
    if where == "off" or not where:
        return None
    d = Path(os.path.abspath(where))
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return None
    return d if safe_path(d) else None


def safe_path(d: Path) -> bool:
    """`d` is a directory of the effective user's, writable by no one else, and no
    other user can rename, replace or link any directory on its way from /."""
    me = os.geteuid()
    parts = d.parts
    for i in range(1, len(parts) + 1):
        at = Path(*parts[:i])
        try:
            st = os.lstat(at)
        except OSError:
            return False
        if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (0, me):
            return False
        last = i == len(parts)
        if last and (st.st_uid != me or st.st_mode & 0o022):
            return False
        # a parent writable by others: only if sticky (they cannot rename our child)
        if not last and st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            return False
    return True


def key(st: os.stat_result, max_rows: int) -> str:
    ident = (VERSION, max_rows, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns,
             st.st_ctime_ns)
    return hashlib.sha256(repr(ident).encode()).hexdigest()


def compile_cached(path: str, max_rows: int, d: Path | None) -> cfi.UnwindTable:
    """`cfi.compile_file(path, max_rows)`, from the cache directory `d` (`cache_dir()`,
    decided once by the recorder; None: no cache) when it holds the file."""
    try:
        # O_NOFOLLOW: the name is a mapping's resolved file (a link there is not it);
        # O_NONBLOCK: a FIFO put at that name is not waited on (refused below)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        raise cfi.CfiError(f"{path}: unreadable ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        table = _compile_fd(path, fd, max_rows, d)
    finally:
        os.close(fd)
    return dataclasses.replace(table, file=(st.st_dev, st.st_ino))  # what was read


def _compile_fd(path: str, fd: int, max_rows: int, d: Path | None) -> cfi.UnwindTable:
    """The cache's entry for the file behind `fd` (keyed by its fstat), else compiled
    from `fd` and kept."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise cfi.CfiError(f"{path}: not a regular file")
    entry = d / key(st, max_rows) if d is not None else None
    if entry is not None:
        got = _read(entry, max_rows)
        if isinstance(got, cfi.UnwindTable):
            return got
        if isinstance(got, str):
            raise cfi.CfiError(f"{path}: {got}")
    try:
        table = cfi.compile_file(path, max_rows, fd)
    except cfi.CfiError as e:
        reason = str(e).removeprefix(f"{path}: ")
        if entry is not None and any(k in reason for k in _KEPT):
            _write(entry, {"v": VERSION, "error": reason})
        raise
    if entry is not None:
        _write(entry, {"v": VERSION, "functions": table.functions,
                       "fp_functions": table.fp_functions, "code_bytes": table.code_bytes,
                       "fp_bytes": table.fp_bytes, "rows": [list(r.pack()) for r in table.rows]})
    return table


def _read(entry: Path, max_rows: int) -> cfi.UnwindTable | str | None:
    """The kept table, or the kept refusal's reason; None when absent or not sound."""
    try:
        with open(entry, "rb") as f:
            if os.fstat(f.fileno()).st_size > MAX_ENTRY_BYTES:
                return None
            doc = json.loads(f.read())
        if doc.get("v") != VERSION:
            return None
        if "error" in doc:
            return doc["error"] if isinstance(doc["error"], str) else None
        return _table(doc, max_rows)
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def _table(doc: dict[str, Any], max_rows: int) -> cfi.UnwindTable | None:
    counts = [doc.get(k) for k in ("functions", "fp_functions", "code_bytes", "fp_bytes")]
    rows = doc.get("rows")
    if not all(isinstance(c, int) and c >= 0 for c in counts) or not isinstance(rows, list):
        return None
    if len(rows) > max_rows:
        return None
    out: list[cfi.Row] = []
    for r in rows:
        if not (isinstance(r, list) and len(r) == 4 and all(isinstance(x, int) for x in r)):
            return None
        pc, cfa, kind, rbp = r
        if kind not in (cfi.STOP, cfi.CFA_RSP, cfi.CFA_RBP) or pc < 0 or (out and pc <= out[-1].pc):
            return None
        if not (0 <= cfa <= cfi.MAX_CFA and 0 <= rbp <= cfi.MAX_RBP_SLOT):
            return None
        out.append(cfi.Row(pc, kind, cfa, rbp))
    functions, fp_functions, code_bytes, fp_bytes = counts
    return cfi.UnwindTable(out, functions, fp_functions, code_bytes, fp_bytes)  # type: ignore[arg-type]


def _write(entry: Path, doc: dict[str, Any]) -> None:
    """Whole or not at all (a temporary file in the directory, renamed); errors ignored:
    the cache only saves time."""
    with contextlib.suppress(OSError):
        fd, tmp = tempfile.mkstemp(dir=entry.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, separators=(",", ":"))
            os.replace(tmp, entry)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
