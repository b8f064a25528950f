"""Where a fleet dataset lives: a local folder or an object store, through fsspec.

Every read and write of a dataset goes through here, so the rest of the fleet
code never knows whether it talks to a disk or to S3. Object stores are
reached with fsspec's own drivers (s3fs for `s3://`); their settings come from
the usual places (AWS_* variables, ~/.aws) or from `storage_options`.

Paths inside a dataset come from its index, which may have been written by
anyone, so `Store.path` is the one gate every read, write and delete passes:
a key must be a plain relative path (`key_problem`) and, on a local disk, must
still be inside the dataset once links are resolved.
"""

from __future__ import annotations

import io
import json
import os
import posixpath
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from gputrace.errors import GputraceError


class DatasetError(GputraceError):
    """The dataset is missing, unreadable, not a gputrace dataset, or cannot be written."""


@dataclass(frozen=True)
class Store:
    """A dataset root: its URL and the options its filesystem needs (picklable, so
    engine tasks rebuild the filesystem next to the data instead of shipping it)."""

    url: str
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def fs(self) -> Any:
        import fsspec.core

        try:
            fs, _ = fsspec.core.url_to_fs(self.url, **self.options)
        except (ImportError, ValueError) as e:
            raise DatasetError(f"{self.url}: cannot reach this storage ({_first(e)})") from None
        return fs

    @property
    def root(self) -> str:
        import fsspec.core

        _, root = fsspec.core.url_to_fs(self.url, **self.options)
        return str(root).rstrip("/") or "/"

    @property
    def local(self) -> bool:
        return "file" in _protocols(self.fs)

    def path(self, rel: str) -> str:
        """Where the object `rel` of this dataset is; DatasetError unless it stays inside
        the dataset. On a local disk links are followed first: a key whose folder (or
        itself) is a link out of the dataset is refused, so nothing outside is read,
        written through or deleted."""
        why = key_problem(rel)
        if why is not None:
            raise DatasetError(f"{self.url}: refusing {rel!r}: not a path inside the dataset "
                               f"({why})")
        root = self.root
        full = posixpath.join(root, rel)
        if self.local:
            real_root, real = os.path.realpath(root), os.path.realpath(full)
            if real == real_root or os.path.commonpath([real_root, real]) != real_root:
                raise DatasetError(f"{self.url}: refusing {rel!r}: a link leads out of the "
                                   "dataset")
        return full

    def exists(self, rel: str) -> bool:
        try:
            return bool(self.fs.exists(self.path(rel)))
        except OSError as e:
            raise DatasetError(f"{self.url}: cannot read ({_first(e)})") from None

    def read_bytes(self, rel: str) -> bytes:
        try:
            with self.fs.open(self.path(rel), "rb") as f:
                return bytes(f.read())
        except FileNotFoundError:
            raise DatasetError(f"{self.url}: {rel} is missing") from None
        except OSError as e:
            raise DatasetError(f"{self.url}/{rel}: cannot read ({_first(e)})") from None

    def read_json(self, rel: str) -> Any:
        try:
            return json.loads(self.read_bytes(rel))
        except (UnicodeDecodeError, ValueError) as e:
            raise DatasetError(f"{self.url}/{rel}: unreadable JSON ({_first(e)})") from None

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Write a whole object; a reader sees the old or the new one, never a part."""
        dest = self.path(rel)
        fs = self.fs
        try:
            fs.makedirs(posixpath.dirname(dest), exist_ok=True)
            if self.local:
                # a local file appears by rename; an object-store PUT is atomic already
                tmp = self.path(rel + ".tmp")
                with fs.open(tmp, "wb") as f:
                    f.write(data)
                fs.mv(tmp, dest)
            else:
                with fs.open(dest, "wb") as f:
                    f.write(data)
        except OSError as e:
            raise DatasetError(f"{self.url}/{rel}: cannot write ({_first(e)})") from None

    def write_json(self, rel: str, value: Any) -> None:
        text = json.dumps(value, indent=1, sort_keys=True, allow_nan=False) + "\n"
        self.write_bytes(rel, text.encode())

    def write_parquet(self, rel: str, table: pa.Table) -> None:
        buf = io.BytesIO()
        pq.write_table(table, buf, compression="zstd")
        self.write_bytes(rel, buf.getvalue())

    def read_parquet(self, rel: str) -> pa.Table:
        try:
            return pq.read_table(io.BytesIO(self.read_bytes(rel)))
        except pa.ArrowException as e:
            raise DatasetError(f"{self.url}/{rel}: corrupt Parquet ({_first(e)})") from None

    def remove(self, rel: str) -> None:
        path = self.path(rel)
        try:
            self.fs.rm(path)
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as e:  # ValueError: a folder (rm is not recursive)
            raise DatasetError(f"{self.url}/{rel}: cannot remove ({_first(e)})") from None


def key_problem(rel: object) -> str | None:
    """Why `rel` cannot name an object inside a dataset on any storage, or None.

    A key is a relative POSIX path of plain names: no leading `/` (absolute on a disk,
    another bucket on S3), no `.` or `..` segment (a disk resolves them, an object store
    keeps them literally or not, depending on the client), no empty segment (`a//b` is
    `a/b` on a disk and another key on S3) and no control character. Every key a
    gputrace export writes has this form; the layout itself is checked by the reader
    of the index (`gputrace.fleet.export.entry_problem`)."""
    if not isinstance(rel, str) or not rel:
        return "not a non-empty string"
    if rel.startswith("/"):
        return "absolute"
    if not rel.isprintable():
        return "control characters"
    segments = rel.split("/")
    if "" in segments:
        return "an empty segment"
    if "." in segments or ".." in segments:
        return "a '.' or '..' segment"
    return None


def _protocols(fs: Any) -> tuple[str, ...]:
    p = fs.protocol
    return (p,) if isinstance(p, str) else tuple(p)


def _first(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
