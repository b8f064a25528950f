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
taken from the same bytes as they pass.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import lzma
import os
import pickle
from dataclasses import dataclass
from typing import IO, Any

from gputrace.errors import GputraceError

XZ_MAGIC = b"\xfd7zXZ\x00"
GZIP_MAGIC = b"\x1f\x8b"


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
        data = self._f.read(len(view))
        n = len(data)
        view[:n] = data
        self.sha256.update(data)
        self.bytes += n
        return n

    def drain(self) -> None:
        """Hash what the reader left unread (bytes after the pickle's STOP)."""
        while self.readinto(bytearray(1 << 20)):
            pass


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
    with contextlib.ExitStack() as files:
        try:
            f = files.enter_context(open(path, "rb"))
        except OSError as e:
            raise PickleRefused(f"{path}: cannot read ({e.strerror or e})") from None
        raw = _Hashing(f)
        buffered = io.BufferedReader(raw, 1 << 20)
        head = buffered.peek(6)[:6]
        stream: io.BufferedIOBase = buffered
        kind = "none"
        if head.startswith(XZ_MAGIC):
            kind, stream = "xz", files.enter_context(lzma.open(buffered))
        elif head.startswith(GZIP_MAGIC):
            kind, stream = "gzip", files.enter_context(gzip.open(buffered))
        try:
            value = PlainUnpickler(stream).load()
            # read the container to its end: its check (CRC) and a cut-off end show
            # only there, after the pickle's last opcode
            while stream.read(1 << 20):
                pass
        except PickleRefused:
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
