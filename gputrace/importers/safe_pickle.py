"""Reading an untrusted pickle as plain data.

A pickle is a program: loading one with `pickle.load` can call any importable function
(`os.system`, `builtins.eval`) with arguments of the file's choosing. Every way a
pickle reaches such a callable (GLOBAL, STACK_GLOBAL, INST, the copyreg extension
codes) goes through `Unpickler.find_class`; `PlainUnpickler` refuses all of them, so
only the opcodes that build dicts, lists, tuples, sets, strings, bytes, numbers,
booleans and None can succeed. Persistent ids are refused too. REDUCE, BUILD and
NEWOBJ then have nothing callable to apply: a plain container is not callable.

Files are read as a stream: xz or gzip is decompressed while the unpickler reads
(never the whole file, then the whole decompressed bytes), and the file's sha256 is
taken from the same bytes as they pass. What decompression may produce is bounded
(`MAX_EXPANSION` times the file, and `MAX_PICKLE_BYTES`): an xz file whose index
declares more is refused before anything is decompressed, and any stream is cut off
at the bound as it is read (docs/security.md).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import lzma
import os
import pickle
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any, cast

from gputrace.errors import GputraceError

XZ_MAGIC = b"\xfd7zXZ\x00"
GZIP_MAGIC = b"\x1f\x8b"

MAX_EXPANSION = 1000
"""Most decompressed bytes per byte of an xz or gzip file. Snapshots compress 9x (the
real H200 one) to about 60x (long histories of one repeated stack, measured on the
synthetic benchmark snapshots); xz itself stops near 7000x on constant input, so a
file past this bound is built to blow up, not a snapshot."""

MAX_PICKLE_BYTES = 16 << 30
"""Most decompressed pickle bytes read at all (16 GiB): a 10^7-entry history with
stacks is about 2 GiB of pickle; unpickled, the bound is already several times the
memory of a large host."""


class PickleRefused(GputraceError):
    """The file is not plain data, or not a readable pickle."""


class PlainUnpickler(pickle.Unpickler):
    """An unpickler that builds only plain containers and scalars."""

    def find_class(self, module: str, name: str) -> Any:
        raise PickleRefused(f"refused: the snapshot names the global {module}.{name}; "
                            "a PyTorch snapshot holds only plain data")

    def persistent_load(self, pid: Any) -> Any:
        raise PickleRefused("refused: the snapshot holds a persistent reference; "
                            "a PyTorch snapshot holds only plain data")


class _Hashing(io.RawIOBase):
    """The bytes of `f`, hashed and counted as they are read."""

    def __init__(self, f: IO[bytes]) -> None:
        self._f = f
        self.sha256 = hashlib.sha256()
        self.bytes = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        n = self._f.readinto(view) or 0  # type: ignore[attr-defined]  # no copy
        self.sha256.update(view[:n])
        self.bytes += n
        return n

    def drain(self) -> None:
        """Hash what the reader left unread (bytes after the pickle's STOP)."""
        while self.readinto(bytearray(1 << 20)):
            pass


class _Bounded(io.RawIOBase):
    """The decompressed stream `f`, refused once more than `limit` bytes come out."""

    def __init__(self, f: IO[bytes], limit: int, why: str) -> None:
        self._f, self.limit, self.why, self.bytes = f, limit, why, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        data = self._f.read(min(len(view), self.limit + 1 - self.bytes) or 1)
        n = len(data)
        self.bytes += n
        if self.bytes > self.limit:
            raise PickleRefused(f"refused: the file decompresses to more than "
                                f"{self.limit:,} bytes ({self.why})")
        view[:n] = data
        return n


def xz_declared_size(f: IO[bytes]) -> int | None:
    """The uncompressed size the xz file `f` declares in its last stream's index (the
    sum of its blocks' uncompressed sizes); None when the footer or index cannot be
    read (the stream is then bounded as it is read)."""
    try:
        end = f.seek(0, os.SEEK_END)
        if end < 32:
            return None
        f.seek(end - 12)
        footer = f.read(12)
        if footer[10:12] != b"YZ":
            return None
        backward = (int.from_bytes(footer[4:8], "little") + 1) * 4
        if backward > min(end - 24, 1 << 24):
            return None
        f.seek(end - 12 - backward)
        index = f.read(backward)
        if not index or index[0] != 0:
            return None
        pos = 1
        values: list[int] = []

        def varint() -> int:
            nonlocal pos
            v, shift = 0, 0
            while pos < len(index) and shift < 63:
                byte = index[pos]
                pos += 1
                v |= (byte & 0x7F) << shift
                if not byte & 0x80:
                    return v
                shift += 7
            raise ValueError("bad varint")

        records = varint()
        if records > len(index):
            return None
        for _ in range(records):
            varint()  # unpadded size
            values.append(varint())
        return sum(values)
    except (OSError, ValueError):
        return None
    finally:
        with contextlib.suppress(OSError):
            f.seek(0)


def expansion_bound(file_bytes: int) -> int:
    """Most decompressed bytes a compressed file of `file_bytes` may produce."""
    return min(MAX_PICKLE_BYTES, max(1 << 20, file_bytes * MAX_EXPANSION))


@dataclass(frozen=True)
class Loaded:
    """A pickle's value and facts about its file."""

    value: Any
    sha256: str
    bytes: int
    compression: str
    """`xz`, `gzip` or `none`, from the file's first bytes (not its name)."""


def load_plain(path: str | os.PathLike[str]) -> Loaded:
    """The plain-data value of the pickle at `path` (xz, gzip or uncompressed, told
    apart by their magic bytes). PickleRefused, one line, for anything else: a file
    naming a global, a truncated or damaged file, a file that is not a pickle."""
    return load_with(path, lambda stream: PlainUnpickler(stream).load())


def load_with(path: str | os.PathLike[str], load: Callable[[IO[bytes]], Any]) -> Loaded:
    """What `load` makes of the pickle at `path`, read through the same opening,
    decompression bounds, hashing and one-line errors as `load_plain` (`load` reads
    the decompressed stream up to the pickle's STOP)."""
    with contextlib.ExitStack() as files:
        try:
            # non-blocking: a FIFO named like a snapshot must not hang the open
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            f = files.enter_context(os.fdopen(fd, "rb"))
        except OSError as e:
            raise PickleRefused(f"{path}: cannot read ({e.strerror or e})") from None
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise PickleRefused(f"{path}: not a regular file")
        size = st.st_size
        limit = expansion_bound(size)
        why = (f"{MAX_EXPANSION}x its {size:,} bytes, at most {MAX_PICKLE_BYTES:,}: "
               "a decompression bomb, not a snapshot")
        if f.read(6).startswith(XZ_MAGIC):
            declared = xz_declared_size(f)
            if declared is not None and declared > limit:
                raise PickleRefused(f"refused: the xz file declares {declared:,} "
                                    f"decompressed bytes, more than {limit:,} ({why})")
        f.seek(0)
        raw = _Hashing(f)
        buffered = io.BufferedReader(raw, 1 << 20)
        head = buffered.peek(6)[:6]
        stream: IO[bytes] = buffered
        kind = "none"
        inner: IO[bytes] | None = None
        if head.startswith(XZ_MAGIC):
            kind = "xz"
            inner = files.enter_context(lzma.open(buffered))
        elif head.startswith(GZIP_MAGIC):
            kind = "gzip"
            gz = gzip.GzipFile(fileobj=buffered)
            files.callback(gz.close)
            inner = cast("IO[bytes]", gz)
        if inner is not None:
            stream = io.BufferedReader(_Bounded(inner, limit, why), 1 << 20)
        try:
            value = load(stream)
            # read the container to its end: its check (CRC) and a cut-off end show
            # only there, after the pickle's last opcode
            while stream.read(1 << 20):
                pass
        except GputraceError:  # refused, or not a snapshot: already one line
            raise
        except (EOFError, lzma.LZMAError, gzip.BadGzipFile) as e:
            raise PickleRefused(f"{path}: truncated or damaged file ({_first_line(e)})"
                                ) from None
        except MemoryError:
            raise PickleRefused(f"{path}: not enough memory to read the snapshot") from None
        except Exception as e:  # untrusted bytes: any failure is one line
            if "truncated" in str(e):  # the unpickler's own word for a short stream
                raise PickleRefused(f"{path}: truncated or damaged file ({_first_line(e)})"
                                    ) from None
            raise PickleRefused(f"{path}: not a readable pickle ({type(e).__name__}: "
                                f"{_first_line(e)})") from None
        raw.drain()  # an uncompressed file's bytes after STOP
        return Loaded(value, raw.sha256.hexdigest(), raw.bytes, kind)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__
