"""Where a recording goes: refuse a bad output directory before anything starts, then
create it (0700) or, with `--force`, empty an old trace of exactly the files its
manifest says gputrace wrote.

The rules (no links followed, nobody else's directory, nothing deleted that the
old manifest does not list) are in docs/security.md; the file operations they
rest on are in `gputrace.trace.files`.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gputrace import schema
from gputrace.errors import TraceError
from gputrace.trace.files import (
    MANIFEST,
    MANIFEST_TMP,
    PART_RE,
    PENDING,
    STATUS_COMPLETE,
    abs_trace_path,
    check_private,
    lock_dir,
    lstat_at,
    open_dir_at,
    read_manifest,
    reason,
)

__all__ = ["check_output", "open_output"]


@dataclass
class _Plan:
    """What `--force` will delete in an existing trace directory, and what it keeps."""

    remove: list[tuple[str | None, str]] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)



def check_output(path: str | os.PathLike[str], *, force: bool = False) -> None:
    """Would `TraceWriter(path, force=force)` refuse? Raises its TraceError; changes nothing.

    For the recorder, to refuse a bad `-o` before it starts anything.
    """
    p = abs_trace_path(path)
    try:
        parent_fd = os.open(p.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return  # created by the writer
    except OSError as e:
        raise TraceError(f"{p.parent}: cannot open ({reason(e)})") from None
    try:
        st = lstat_at(parent_fd, p.name)
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
    fd = open_dir_at(parent_fd, p.name, p)
    try:
        check_private(fd, p)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_output(p: Path, force: bool, note: Callable[[str], None]) -> int:
    """The trace directory's descriptor: created 0700, or an old trace emptied (--force)."""
    try:
        os.makedirs(p.parent, exist_ok=True)
        parent_fd = os.open(p.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise TraceError(f"{p.parent}: cannot create or open ({reason(e)})") from None
    try:
        st = lstat_at(parent_fd, p.name)
        if st is None:
            try:
                os.mkdir(p.name, 0o700, dir_fd=parent_fd)
            except FileExistsError:
                raise TraceError(f"{p} appeared while gputrace was creating it; "
                                 "refusing to write into it") from None
            except OSError as e:
                raise TraceError(f"{p}: cannot create ({reason(e)})") from None
            fd = open_dir_at(parent_fd, p.name, p)
            try:
                lock_dir(fd, p)
                # swapped between mkdir and open (for someone else's directory, or one
                # of ours with content): what we opened must be what we just made
                check_private(fd, p)
                if os.listdir(fd):
                    raise TraceError(f"{p} was replaced while gputrace was creating it; "
                                     "refusing to write into it")
            except BaseException:
                os.close(fd)
                raise
        else:
            fd = _open_existing(parent_fd, p, st, force)
            try:
                lock_dir(fd, p)  # before anything is deleted: it may be a recording
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
        raw = read_manifest(fd, MANIFEST, p / MANIFEST)
    except TraceError as e:
        raise TraceError(f"{p} exists and is not a trace we can replace ({e}); "
                         "refusing to overwrite") from None
    # Parquet and raw parts (`record --raw`) share one numbering per table
    # (a flight recording, `record --keep`, deleted the oldest: `last_part` is the last)
    listed: dict[str, int] = {t: int(v.get("last_part", int(v["parts"])
                                           + int(v.get("raw_parts", 0))))
                              for t, v in raw.get("tables", {}).items()}  # fmt: skip
    unknown = sorted(set(listed) - set(schema.TABLES))
    if unknown:
        raise TraceError(f"{p}: its manifest lists table {unknown[0]!r}, unknown to this "
                         "gputrace; refusing to overwrite")
    finished = raw.get("status") == STATUS_COMPLETE
    refuse: list[str] = []
    for name in entries:
        st = lstat_at(fd, name)
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
            tfd = open_dir_at(fd, name, p / name)
            try:
                check_private(tfd, p / name)
                for sub in sorted(os.listdir(tfd)):
                    sst = lstat_at(tfd, sub)
                    m = PART_RE.fullmatch(sub)
                    ours = (m is not None and sst is not None and stat.S_ISREG(sst.st_mode)
                            and sub == f"part-{int(m[1]):06d}.{m[2]}{m[3] or ''}"
                            and 1 <= int(m[1]) <= last
                            and (m[3] is None or (int(m[1]) == last and not finished)))
                    # a recording's rows still in progress (tracewriter.set_pending)
                    ours = ours or (sub in (PENDING, PENDING + ".tmp") and sst is not None
                                    and stat.S_ISREG(sst.st_mode))  # fmt: skip
                    if ours:
                        plan.remove.append((name, sub))
                    elif m is not None or sub.endswith((".parquet", ".gtraw")):
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
        tfd = open_dir_at(fd, t, p / t)
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
