"""Where a fleet dataset lives: a local folder or an object store, through fsspec.

Every read and write of a dataset goes through here, so the rest of the fleet
code never knows whether it talks to a disk or to S3. Object stores are
reached with fsspec's own drivers (s3fs for `s3://`); their settings come from
the usual places (AWS_* variables, ~/.aws) or from `storage_options`.
"""

from __future__ import annotations

import io
import json
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
        return str(root).rstrip("/")

    @property
    def local(self) -> bool:
        return "file" in _protocols(self.fs)

    def path(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

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
                tmp = dest + ".tmp"
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
        try:
            self.fs.rm(self.path(rel))
        except FileNotFoundError:
            pass
        except OSError as e:
            raise DatasetError(f"{self.url}/{rel}: cannot remove ({_first(e)})") from None


def _protocols(fs: Any) -> tuple[str, ...]:
    p = fs.protocol
    return (p,) if isinstance(p, str) else tuple(p)


def _first(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
