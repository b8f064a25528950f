"""The trace as a native Perfetto protobuf trace (`--format perfetto`).

Packets are built with the message classes the `perfetto` PyPI package ships
(generated from Perfetto's published perfetto_trace.proto) and streamed one at
a time as `Trace.packet` entries (field 1, length-delimited), so memory stays
flat however many rows the trace has. Layout:

- a process track per pid and a thread track per (pid, tid); CUDA calls are
  slices on the thread track, ioctls slices on an "ioctls" child track of the
  thread (a CUDA call contains the ioctls it makes, so separate tracks keep
  both nestings valid); a call without latency is an instant;
- instant events for faults (a "faults" track per process) and migrations
  (one global track);
- counter tracks: live bytes per (layer, process), bytes in use per GPU, and
  faults / batches / migrations per second.

Timestamps are the trace's CLOCK_MONOTONIC nanoseconds, written without a clock
id, so Perfetto shows them as the trace's own clock.
"""

from __future__ import annotations

import functools
import struct
import zlib
from collections.abc import Iterator
from typing import Any, BinaryIO

import polars as pl

from gputrace.render.perfetto_wire import SEQ, Tags, len_bytes, varint

BATCH_ROWS = 65_536


def _pb() -> Any:
    from perfetto.protos.perfetto.trace import (  # type: ignore[import-untyped]
        perfetto_trace_pb2,
    )

    return perfetto_trace_pb2


@functools.lru_cache(maxsize=65_536)
def _uuid(*parts: object) -> int:
    """A stable 63-bit track uuid from its identity (no collisions among our few kinds)."""
    key = "/".join(str(p) for p in parts).encode()
    return (zlib.crc32(key) << 31 | zlib.adler32(key) >> 1) & ((1 << 63) - 1) or 1


class Writer:
    """Streams TracePackets to a binary file as a Perfetto `Trace`."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.pb = _pb()
        self.packets = 0
        self.first = True
        self.tags = Tags(self.pb)

    def packet(self, pkt: Any) -> None:
        pkt.trusted_packet_sequence_id = SEQ
        if self.first:
            pkt.sequence_flags = self.pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
            self.first = False
        self.out.write(b"\x0a" + len_bytes(pkt.SerializeToString()))  # Trace.packet = 1
        self.packets += 1

    def track(self, uuid: int, name: str | None = None, parent: int | None = None,
              **desc: Any) -> None:
        pkt = self.pb.TracePacket()
        td = pkt.track_descriptor
        td.uuid = uuid
        if name is not None:
            td.name = name
        if parent is not None:
            td.parent_uuid = parent
        for field, values in desc.items():
            getattr(td, field).SetInParent()
            for k, v in values.items():
                setattr(getattr(td, field), k, v)
        self.packet(pkt)

    def event(self, ts: int, track: int, kind: int, name: str | None = None,
              args: dict[str, Any] | None = None, value: float | None = None) -> None:
        """One TrackEvent packet, encoded directly (this is the hot path: one or two per
        row); the field numbers are read from the schema's descriptors (`Tags`)."""
        t = self.tags
        ev = [t.type, varint(kind), t.track(track)]
        if name is not None:
            ev.append(t.name_field(name))
        if value is not None:
            ev.append(t.counter + struct.pack("<d", value))
        for k, v in (args or {}).items():
            if v is None:
                continue
            body = t.ann_name(k) + (t.ann_str + len_bytes(v.encode()) if isinstance(v, str)
                                    else t.ann_int + varint(int(v)))
            ev.append(t.ann + varint(len(body)) + body)
        te = b"".join(ev)
        pkt = t.ts + varint(ts) + t.track_event + varint(len(te)) + te + t.seq
        if self.first:
            self.packet(self.pb.TracePacket())  # carries the sequence flags
        self.out.write(b"\x0a" + varint(len(pkt)) + pkt)
        self.packets += 1


def _rows(frame: pl.LazyFrame) -> Iterator[dict[str, Any]]:
    for batch in frame.sort("ts_ns").collect().iter_slices(BATCH_ROWS):
        yield from batch.iter_rows(named=True)


def render_perfetto(tl: dict[str, Any], out: BinaryIO) -> int:
    """Write the timeline `tl` (`analyses.timeseries.timeline`) as a Perfetto trace;
    returns the number of packets written."""
    w = Writer(out)
    te = w.pb.TrackEvent
    begin, end, instant = te.TYPE_SLICE_BEGIN, te.TYPE_SLICE_END, te.TYPE_INSTANT
    procs: set[int] = set()

    def process(pid: int, name: str | None) -> int:
        if pid not in procs:
            procs.add(pid)
            w.track(_uuid("p", pid), process={"pid": pid, "process_name": name or str(pid)})
        return _uuid("p", pid)

    for t in tl["threads"].collect().iter_rows(named=True):
        proc = process(t["pid"], t["process"] or t["comm"])
        thread = _uuid("t", t["pid"], t["tid"])
        w.track(thread, parent=proc, thread={"pid": t["pid"], "tid": t["tid"],
                                             "thread_name": t["comm"] or str(t["tid"])})
        w.track(_uuid("io", t["pid"], t["tid"]), "ioctls", thread)

    def calls(frame: pl.LazyFrame, name_col: str, track: str, args: tuple[str, ...]) -> None:
        for r in _rows(frame):
            tr = (_uuid("io", r["pid"], r["tid"]) if track == "io"
                  else _uuid("t", r["pid"], r["tid"]))
            a = {k: r[k] for k in args}
            lat = r["latency_ns"]
            if lat is None:
                w.event(r["ts_ns"], tr, instant, r[name_col], a)
            else:
                w.event(r["ts_ns"], tr, begin, r[name_col], a)
                w.event(r["ts_ns"] + lat, tr, end)

    calls(tl["ioctls"], "name", "io",
          ("size_bytes", "handle", "status", "ret", "latency_ns", "gpu_index"))
    calls(tl["cuda_calls"], "func", "t",
          ("size_bytes", "ptr", "handle", "result", "latency_ns"))

    fault_tracks: set[int] = set()
    for r in _rows(tl["faults"]):
        tr = _uuid("f", r["pid"])
        if tr not in fault_tracks:
            fault_tracks.add(tr)
            w.track(tr, "faults", process(r["pid"], None))
        w.event(r["ts_ns"], tr, instant, f"fault {r['source']} {r['access_type']}",
                {"address": r["address"], "gpu_index": r["gpu_index"]})
    mig = _uuid("migrations")
    w.track(mig, "migrations")
    for r in _rows(tl["migrations"]):
        w.event(r["ts_ns"], mig, instant, f"migration {r['cause']}",
                {"src": r["src"], "dst": r["dst"], "size_bytes": r["size_bytes"],
                 "address": r["address"], "pid": r["pid"]})
    _counters(w, tl, process)
    return w.packets


def _counters(w: Writer, tl: dict[str, Any], process: Any) -> None:
    counter = w.pb.TrackEvent.TYPE_COUNTER
    start = tl.get("start_ns", 0)
    bytes_unit = w.pb.CounterDescriptor.UNIT_SIZE_BYTES

    def series(uuid: int, name: str, parent: int | None, s: dict[str, Any], key: str,
               unit: int | None) -> None:
        w.track(uuid, name, parent, counter={"unit": unit} if unit else {})
        for t, v in zip(s["t_s"], s[key], strict=True):
            w.event(start + round(t * 1e9), uuid, counter, value=float(v))

    for s in tl["live_bytes"]["series"]:
        series(_uuid("live", s["layer"], s["pid"]), f"live bytes {s['layer']}",
               process(s["pid"], None), s, "values", bytes_unit)
    for s in tl["gpu_bytes"]["series"]:
        series(_uuid("gpu", s["gpu_index"]), f"GPU {s['gpu_index']} bytes in use", None, s,
               "values", bytes_unit)
    for key, part in tl["fault_rates"].items():
        if not isinstance(part, dict) or not part["recorded"]:
            continue
        for s in part["series"]:
            name = f"{key} per s" + (f" {s['name']}" if s["name"] else "")
            series(_uuid("rate", key, s["name"]), name, None, s, "per_s", None)
