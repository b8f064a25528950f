"""The files of a trace directory: their names, and the descriptor-relative operations
that create and read them without following links.

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

Used by `traceoutput` (preparing the directory), `tracewriter` (writing it) and
`tracedir` (reading it); it imports neither polars nor pydantic at load time.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

from gputrace.errors import TraceError

MANIFEST = "manifest.json"
MANIFEST_TMP = MANIFEST + ".tmp"
PART_GLOB = "part-*.parquet"
PART_RE = re.compile(r"part-(\d+)\.(parquet|gtraw)(\.tmp)?")
"""A part's file name: number, kind (Parquet, or raw: gputrace.trace.rawparts), `.tmp`
while written."""

PENDING = "pending.parquet"
"""A table folder's rows of things still in progress at the last rotation (the
processes still running), replaced at each rotation and removed when the recording
ends; `gputrace convert` turns a recording's last one into a part (its recorder was
killed). Not a part: readers never scan it."""

STATUS_RECORDING = "recording"
STATUS_COMPLETE = "complete"

_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_O_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CREATE_TRIES = 3


def part_name(n: int, kind: str = "parquet") -> str:
    """The file name of a table's `n`-th part (1-based); `kind` "gtraw" for a raw part."""
    return f"part-{n:06d}.{kind}"


def lock_dir(fd: int, where: Path) -> None:
    """Hold the trace directory `fd` exclusively until it is closed: a recorder, a
    `--force` replacing it and a conversion never write one trace together."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise TraceError(f"{where} is being written by another gputrace right now "
                         "(a recording or a conversion); try again when it ends") from None


def reason(e: OSError) -> str:
    """An OSError as the few words a one-line error ends with."""
    return e.strerror or type(e).__name__


def abs_trace_path(path: str | os.PathLike[str]) -> Path:
    """`path` made absolute; a filesystem root cannot be a trace directory."""
    p = Path(os.path.abspath(path))
    if p == p.parent:
        raise TraceError(f"{p} cannot be a trace directory")
    return p


def open_dir_at(dir_fd: int | None, name: str | Path, where: Path) -> int:
    """Open a directory without following a link in its last component."""
    try:
        return os.open(name, _O_DIR, dir_fd=dir_fd)
    except OSError as e:
        st = lstat_at(dir_fd, name)
        if st is not None and stat.S_ISLNK(st.st_mode):
            raise TraceError(f"{where} is a symbolic link; refusing to write through it") from None
        if st is not None and not stat.S_ISDIR(st.st_mode):
            raise TraceError(f"{where} exists and is not a directory") from None
        raise TraceError(f"{where}: cannot open ({reason(e)})") from None


def lstat_at(dir_fd: int | None, name: str | Path) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def check_private(fd: int, where: Path) -> None:
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


def create_file(dir_fd: int, name: str, where: Path) -> int:
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
                                 f"({reason(e)})") from None
            continue
        os.fchmod(fd, 0o600)  # exactly 0600 whatever the umask
        return fd
    raise TraceError(f"{where / name}: something keeps creating this name; refusing to write")



def _read_at(dir_fd: int | None, name: str | Path, where: Path) -> bytes:
    """A small regular file's bytes (non-blocking open: a FIFO must not hang us)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as e:
        raise TraceError(f"{where}: unreadable manifest ({reason(e)})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise TraceError(f"{where}: unreadable manifest (not a regular file)")
        chunks = []
        from gputrace.trace.manifest import MAX_BYTES

        left = MAX_BYTES + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError as e:
        raise TraceError(f"{where}: unreadable manifest ({reason(e)})") from None
    finally:
        os.close(fd)


def read_manifest(dir_fd: int | None, name: str | Path, where: Path) -> dict[str, Any]:
    """The manifest `name` (relative to `dir_fd`), parsed; TraceError with a one-line
    reason when it cannot be read or is not a gputrace manifest.

    The manifest model (pydantic) is imported on first use: the recorder's write
    path never reads a manifest, and production hosts need not install pydantic.
    """
    from gputrace.trace import manifest

    return manifest.parse(_read_at(dir_fd, name, where), str(where))
