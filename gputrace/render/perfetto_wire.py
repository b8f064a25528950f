"""Protobuf wire encoding of the Perfetto packets written once per row (the hot path).

Field keys come from the descriptors of the message classes generated from Perfetto's
published perfetto_trace.proto, so a field number is never typed in by hand; only the
wire format (base-128 varints, length-delimited fields, little-endian doubles) is.

Rows are encoded a column at a time with numpy: each field's varints are computed over
the whole column (`varints`), every packet is a list of segments (a field key, a
varint, a length prefix computed from the lengths of the segments it wraps), and
`scatter` writes the segments of all rows into one buffer, byte column by byte column.
Names are interned (`InternedData`): a row carries the small iid of its event name
and of each argument's name, not the strings.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

SEQ = 1
"""trusted_packet_sequence_id of every packet: one writer, one sequence."""

U8 = npt.NDArray[np.uint8]
I64 = npt.NDArray[np.int64]
Seg = tuple[I64, U8]
"""A field part of every row: per-row byte lengths (0: absent) and a rows x width
matrix of bytes, of which each row uses its first `length`."""
_SEVEN, _LOW = np.uint64(7), np.uint64(0x7F)


def varint(n: int) -> bytes:
    """Protobuf base-128 varint; negative int64 as its 10-byte two's complement."""
    if n < 0:
        n += 1 << 64
    if n < 0x80:
        return bytes((n,))
    last = (n.bit_length() - 1) // 7
    return bytes([(n >> s & 0x7F) | 0x80 for s in range(0, 7 * last, 7)] + [n >> 7 * last])


def len_bytes(b: bytes) -> bytes:
    return varint(len(b)) + b


def varints(v: npt.NDArray[Any], present: npt.NDArray[np.bool_] | None = None) -> Seg:
    """The varint of every value of an integer column (signed: int64 two's complement,
    as `varint`); rows where `present` is false get length 0."""
    u = (v.astype(np.int64).view(np.uint64) if v.dtype.kind == "i"
         else v.astype(np.uint64))
    n = len(u)
    top = int(u.max()) if n else 0
    width = max(1, -(-top.bit_length() // 7))
    if width == 1:  # most fields (types, iids, small numbers): one byte, no shifting
        lens = np.ones(n, np.int64)
        data = u.astype(np.uint8).reshape(n, 1)
    else:
        lens = np.ones(n, np.int64)
        for k in range(1, width):
            lens += u >= np.uint64(1 << 7 * k)
        data = np.empty((n, width), np.uint8)
        x = u.copy()
        for k in range(width):
            data[:, k] = (x & _LOW).astype(np.uint8) | 0x80
            x >>= _SEVEN
        data[np.arange(n), lens - 1] &= 0x7F
    if present is not None:
        lens = np.where(present, lens, 0)
    return lens, data


def const(b: bytes, n: int, present: npt.NDArray[np.bool_] | None = None) -> Seg:
    """The same bytes in every row (or in the rows where `present`)."""
    lens = np.full(n, len(b), np.int64)
    if present is not None:
        lens = np.where(present, lens, 0)
    return lens, np.broadcast_to(np.frombuffer(b, np.uint8), (n, len(b)))


def total(segs: list[Seg]) -> I64:
    """Per-row byte length of `segs` (what a length prefix wrapping them says)."""
    out = np.zeros(len(segs[0][0]), np.int64)
    for lens, _ in segs:
        out += lens
    return out


SCATTER_ROWS = 4096
"""Rows laid side by side at once in `scatter`: a matrix that stays in the CPU cache."""


def scatter(segs: list[Seg]) -> bytes:
    """Rows of `segs` (each row its segments in order), the rows one after another.
    Per block of rows, the segments are laid side by side in one rows x bytes matrix
    and the bytes each row uses are read out row by row (one `compress`)."""
    n = len(segs[0][0])
    width = sum(d.shape[1] for _, d in segs)
    rows = min(n, SCATTER_ROWS)
    mat = np.empty((rows, width), np.uint8)
    used = np.empty((rows, width), np.bool_)
    upto = np.arange(max(d.shape[1] for _, d in segs))
    parts = []
    for i in range(0, n, rows):
        j = min(n, i + rows)
        c = 0
        for lens, data in segs:
            k = data.shape[1]
            mat[:j - i, c:c + k] = data[i:j]
            np.less(upto[:k], lens[i:j, None], out=used[:j - i, c:c + k])
            c += k
        parts.append(np.compress(used[:j - i].ravel(), mat[:j - i].ravel()))
    return b"".join(p.tobytes() for p in parts)


def _tag(msg: Any, field: str, wire: int) -> bytes:
    return varint(msg.DESCRIPTOR.fields_by_name[field].number << 3 | wire)


class Tags:
    """Encoded field keys of the messages the hot path writes, from the descriptors of
    Perfetto's perfetto_trace.proto."""

    def __init__(self, pb: Any) -> None:
        tp, te, da = pb.TracePacket, pb.TrackEvent, pb.DebugAnnotation
        self.packet = b"\x0a"  # Trace.packet = 1, length-delimited
        self.ts, self.track_event = _tag(tp, "timestamp", 0), _tag(tp, "track_event", 2)
        self.seq = _tag(tp, "trusted_packet_sequence_id", 0) + varint(SEQ)
        # packets naming interned iids depend on the sequence's incremental state
        self.seq_interned = self.seq + _tag(tp, "sequence_flags", 0) + varint(
            tp.SEQ_NEEDS_INCREMENTAL_STATE)
        self.type, self.track_uuid = _tag(te, "type", 0), _tag(te, "track_uuid", 0)
        self.name, self.counter = _tag(te, "name", 2), _tag(te, "double_counter_value", 1)
        self.name_iid = _tag(te, "name_iid", 0)
        self.ann = _tag(te, "debug_annotations", 2)
        self.ann_key_iid, self.ann_int = _tag(da, "name_iid", 0), _tag(da, "int_value", 0)
        self.begin, self.end = te.TYPE_SLICE_BEGIN, te.TYPE_SLICE_END
        self.counter_type = self.type + varint(te.TYPE_COUNTER)


def event_rows(t: Tags, ts: I64, uuid: npt.NDArray[Any], kind: npt.NDArray[Any],
               name_iid: npt.NDArray[Any],
               args: list[tuple[int, npt.NDArray[Any], npt.NDArray[np.bool_]]],
               end_ts: I64 | None = None,
               has_end: npt.NDArray[np.bool_] | None = None) -> bytes:
    """One TrackEvent packet per row (`kind`: its type, `name_iid`: its interned name,
    `args`: (interned key, values, present) integer debug annotations) and, where
    `has_end`, the slice's end packet at `end_ts` right after it."""
    n = len(ts)
    uuid_seg = varints(uuid)
    te: list[Seg] = [const(t.type, n), varints(kind), const(t.track_uuid, n), uuid_seg,
                     const(t.name_iid, n), varints(name_iid)]
    for key, values, present in args:
        key_int = const(t.ann_key_iid + varint(key) + t.ann_int, n, present)
        val = varints(values, present)
        body = key_int[0] + val[0]
        te += [const(t.ann, n, present), varints(body, present), key_int, val]
    pkt = [const(t.ts, n), varints(ts), const(t.track_event, n), varints(total(te)), *te,
           const(t.seq_interned, n)]
    segs = [const(t.packet, n), varints(total(pkt)), *pkt]
    if end_ts is not None and has_end is not None and has_end.any():
        m = has_end
        end_te = [const(t.type + varint(t.end) + t.track_uuid, n, m),
                  (np.where(m, uuid_seg[0], 0), uuid_seg[1])]
        end_pkt = [const(t.ts, n, m), varints(end_ts, m), const(t.track_event, n, m),
                   varints(total(end_te), m), *end_te, const(t.seq, n, m)]
        segs += [const(t.packet, n, m), varints(total(end_pkt), m), *end_pkt]
    return scatter(segs)


def counter_rows(t: Tags, ts: I64, uuid: npt.NDArray[Any],
                 value: npt.NDArray[np.float64]) -> bytes:
    """One counter TrackEvent packet per row (`value` as double_counter_value)."""
    n = len(ts)
    dbl = value.astype("<f8").view(np.uint8).reshape(n, 8)
    te: list[Seg] = [const(t.counter_type + t.track_uuid, n), varints(uuid),
                     const(t.counter, n), (np.full(n, 8, np.int64), dbl)]
    pkt = [const(t.ts, n), varints(ts), const(t.track_event, n), varints(total(te)), *te,
           const(t.seq, n)]
    return scatter([const(t.packet, n), varints(total(pkt)), *pkt])
