"""Raw parts: a table's events as the probes staged them, compressed and not yet
decoded (`gputrace record --raw`; docs/trace-format.md, "Raw parts").

Decoding staged records into typed columns and encoding them as Parquet costs
~1.4 µs of recorder CPU per event; compressing the records as they came costs
~0.06 µs. A raw part lets a busy production host pay only the latter and leaves
the decoding to `gputrace convert`, on any machine, later (as `perf record`
leaves symbolization to `perf report`, and Nsight Systems its .qdstrm stream to
the importer). Readers refuse a trace that still holds raw parts, with a line
saying how to convert it.

A raw part is one file, `<table>/part-NNNNNN.gtraw`, numbered in the same
sequence as the table's Parquet parts::

    MAGIC                     8 bytes
    u32 header length, header JSON: table, record, itemsize, fields, codec
    frames: u32 raw length, u32 compressed length, u32 CRC-32 of the compressed
            bytes, the compressed records ...

`fields` is the record's layout (numpy's descr): a converter
refuses a part whose layout is not the one it decodes, rather than misread it.
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any, Final, NamedTuple

import numpy as np
import pyarrow as pa

from gputrace.errors import TraceError
from gputrace.trace.files import part_name

MAGIC = b"GTRAW\x00\x01\n"
RAW_GLOB = "part-*.gtraw"
CODEC: Final = "zstd"
LEVEL = 1  # level 1: ~60 ns per 168-byte event, ~6 bytes an event on a storm (level 3: ~95)
_U32 = struct.Struct("<I")
_FRAME = struct.Struct("<III")
FRAME_MAX = 1 << 30  # a frame's raw bytes (the recorder hands ~8 MiB at a time)
HEADER_MAX = 1 << 20


def raw_part_name(n: int) -> str:
    """The file name of a table's `n`-th part (1-based) when it is raw."""
    return part_name(n, "gtraw")


def layout(dtype: np.dtype[Any]) -> list[Any]:
    """A record layout as the header stores it: numpy's descr (names, types, shapes
    and padding, in order), as JSON reads it back."""
    out: list[Any] = json.loads(json.dumps(dtype.descr))
    return out


def header(table: str, record: str, dtype: np.dtype[Any]) -> bytes:
    """MAGIC and the header of a raw part of `table` holding `record` structs."""
    meta = {"table": table, "record": record, "itemsize": dtype.itemsize,
            "fields": layout(dtype), "codec": CODEC}  # fmt: skip
    body = json.dumps(meta, sort_keys=True).encode()
    return MAGIC + _U32.pack(len(body)) + body


def frame(records: bytes | memoryview) -> bytes:
    """One compressed frame of whole records."""
    n = len(records)
    if n > FRAME_MAX:
        raise TraceError(f"a raw frame of {n} bytes is over {FRAME_MAX}")
    comp = pa.Codec(CODEC, LEVEL).compress(records, asbytes=True)
    # zstd alone may decode a damaged frame into wrong records of the right length;
    # the CRC is of the compressed bytes (~30x fewer than the records: ~5 ns an event)
    return _FRAME.pack(n, len(comp), zlib.crc32(comp)) + comp


class Frame(NamedTuple):
    """One frame of a raw part, checked but still compressed."""

    at: int  # its offset in the part (for messages)
    size: int  # bytes of records once decompressed
    data: memoryview  # the compressed bytes


def read(data: bytes, where: str) -> tuple[dict[str, Any], list[Frame]]:
    """The header and the frames of a raw part's bytes, every frame's length and
    CRC checked (decompress each with `records`: one at a time, a part's records
    never need to be in memory together); TraceError naming `where` when they are
    cut short, damaged or not a raw part."""
    if not data.startswith(MAGIC):
        raise TraceError(f"{where}: not a gputrace raw part")
    pos = len(MAGIC)
    if len(data) < pos + 4:
        raise TraceError(f"{where}: raw part cut short in its header")
    (hlen,) = _U32.unpack_from(data, pos)
    pos += 4
    if hlen > HEADER_MAX or len(data) < pos + hlen:
        raise TraceError(f"{where}: raw part cut short in its header")
    try:
        meta = json.loads(data[pos : pos + hlen])
    except RecursionError:  # `[[[[...` a few thousand deep
        raise TraceError(f"{where}: unreadable raw part header (nested too deeply)") from None
    except ValueError as e:
        raise TraceError(f"{where}: unreadable raw part header ({type(e).__name__})") from None
    # exact types, no conversions: `1e400` is a float (infinity), `true` a bool
    itemsize = meta.get("itemsize") if isinstance(meta, dict) else None
    if (not isinstance(itemsize, int) or isinstance(itemsize, bool)
            or not 0 < itemsize <= FRAME_MAX or meta.get("codec") != CODEC):
        raise TraceError(f"{where}: unreadable raw part header (itemsize, codec)")
    pos += hlen
    view = memoryview(data)
    out: list[Frame] = []
    while pos < len(data):
        if len(data) < pos + _FRAME.size:
            raise TraceError(f"{where}: raw part cut short at byte {pos}")
        n, c, crc = _FRAME.unpack_from(data, pos)
        pos += _FRAME.size
        if n > FRAME_MAX or n % itemsize or len(data) < pos + c:
            raise TraceError(f"{where}: raw part cut short or damaged at byte {pos}")
        body = view[pos : pos + c]
        if zlib.crc32(body) != crc:
            raise TraceError(f"{where}: damaged raw frame at byte {pos} (CRC mismatch)")
        out.append(Frame(pos, n, body))
        pos += c
    return meta, out


def records(frame: Frame, where: str) -> bytes:
    """A frame's records, decompressed."""
    try:
        chunk = pa.Codec(CODEC).decompress(frame.data, decompressed_size=frame.size,
                                           asbytes=True)  # fmt: skip
    except (pa.ArrowException, OSError) as e:
        raise TraceError(f"{where}: damaged raw frame at byte {frame.at} ({e})") from None
    if len(chunk) != frame.size:
        raise TraceError(f"{where}: damaged raw frame at byte {frame.at}")
    return chunk
