"""Protobuf wire encoding of the Perfetto packets written once per row (the hot path).

Field keys come from the descriptors of the message classes generated from Perfetto's
published perfetto_trace.proto, so a field number is never typed in by hand; only the
wire format (base-128 varints, length-delimited fields, little-endian doubles) is.
"""

from __future__ import annotations

from typing import Any

SEQ = 1
"""trusted_packet_sequence_id of every packet: one writer, one sequence."""


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


def _tag(msg: Any, field: str, wire: int) -> bytes:
    return varint(msg.DESCRIPTOR.fields_by_name[field].number << 3 | wire)


class Tags:
    """Encoded field keys of the messages the hot path writes, from the descriptors of
    Perfetto's perfetto_trace.proto, plus caches of encoded names."""

    def __init__(self, pb: Any) -> None:
        tp, te, da = pb.TracePacket, pb.TrackEvent, pb.DebugAnnotation
        self.ts, self.track_event = _tag(tp, "timestamp", 0), _tag(tp, "track_event", 2)
        self.seq = _tag(tp, "trusted_packet_sequence_id", 0) + varint(SEQ)
        self.type, self.track_uuid = _tag(te, "type", 0), _tag(te, "track_uuid", 0)
        self.name, self.counter = _tag(te, "name", 2), _tag(te, "double_counter_value", 1)
        self.ann = _tag(te, "debug_annotations", 2)
        self.ann_key, self.ann_int = _tag(da, "name", 2), _tag(da, "int_value", 0)
        self.ann_str = _tag(da, "string_value", 2)
        self._names: dict[str, bytes] = {}
        self._keys: dict[str, bytes] = {}
        self._tracks: dict[int, bytes] = {}

    def track(self, uuid: int) -> bytes:
        b = self._tracks.get(uuid)
        if b is None:
            b = self._tracks[uuid] = self.track_uuid + varint(uuid)
        return b

    def name_field(self, name: str) -> bytes:
        b = self._names.get(name)
        if b is None:
            b = self._names[name] = self.name + len_bytes(name.encode())
        return b

    def ann_name(self, key: str) -> bytes:
        b = self._keys.get(key)
        if b is None:
            b = self._keys[key] = self.ann_key + len_bytes(key.encode())
        return b
