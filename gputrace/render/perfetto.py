"""The trace as a native Perfetto protobuf trace (`--format perfetto`).

Track descriptors and interned names are built with the message classes the
`perfetto` PyPI package ships (generated from Perfetto's published
perfetto_trace.proto); the packets of the rows (one or two per row) are encoded
a column at a time (`perfetto_wire`) in batches of `BATCH_ROWS` and written as
`Trace.packet` entries (field 1, length-delimited). Event and argument names are
interned (`InternedData`; the first packet clears the incremental state, the
packets naming iids need it). Layout:

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
import zlib
from collections.abc import Callable
from typing import Any, BinaryIO

import numpy as np
import polars as pl

from gputrace.render.perfetto_wire import SEQ, Tags, counter_rows, event_rows, len_bytes

BATCH_ROWS = 65_536
"""Rows encoded at once: numpy buffers of tens of MiB, whatever the trace's size."""
ARGS = ("size_bytes", "handle", "status", "ret", "latency_ns", "gpu_index", "ptr", "result",
        "address", "src", "dst", "pid")
"""Debug annotation names, interned once at the start of the sequence."""


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
        self.tags = Tags(self.pb)
        self.event_iids: dict[str, int] = {}
        self.arg_iids = {k: i for i, k in enumerate(ARGS, 1)}
        # the first packet clears the incremental state and interns the argument names
        pkt = self.pb.TracePacket()
        pkt.sequence_flags = self.pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
        for k, i in self.arg_iids.items():
            pkt.interned_data.debug_annotation_names.add(iid=i, name=k)
        self.packet(pkt)

    def packet(self, pkt: Any) -> None:
        pkt.trusted_packet_sequence_id = SEQ
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

    def counters(self, points: list[tuple[int, list[float], list[Any]]], start: int) -> None:
        """Counter values: (track uuid, times in s from `start`, values) per series."""
        if not points:
            return
        ts = np.concatenate([start + np.round(np.asarray(t, np.float64) * 1e9).astype(np.int64)
                             for _, t, _ in points])
        uuid = np.concatenate([np.full(len(t), u, np.uint64) for u, t, _ in points])
        val = np.concatenate([np.asarray(v, np.float64) for _, _, v in points])
        for i in range(0, len(ts), BATCH_ROWS):
            sl = slice(i, i + BATCH_ROWS)
            self.out.write(counter_rows(self.tags, ts[sl], uuid[sl], val[sl]))
        self.packets += len(ts)

    def intern(self, names: list[str]) -> None:
        """Intern the event names not yet interned (one packet for all of them)."""
        new = sorted(set(names) - self.event_iids.keys())
        if not new:
            return
        pkt = self.pb.TracePacket()
        pkt.sequence_flags = self.pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
        for name in new:
            iid = self.event_iids[name] = len(self.event_iids) + 1
            pkt.interned_data.event_names.add(iid=iid, name=name)
        self.packet(pkt)

    def rows(self, frame: pl.LazyFrame, name: pl.Expr, uuid: Callable[[Any], int],
             keys: tuple[str, ...], args: tuple[str, ...], slices: bool) -> None:
        """A TrackEvent per row of `frame`, in time order, on the track `uuid(key)` of
        its `keys`: with `slices`, a slice [ts_ns, ts_ns + latency_ns] (an instant
        where latency is null), else an instant; `args`: the integer columns written
        as debug annotations of the same name (null: left out)."""
        named = frame.with_columns(_name=name)
        # the few distinct names and tracks first, so the rows are collected as numbers
        found = pl.collect_all([named.select(pl.col("_name").unique()),
                                named.select(keys or [pl.lit(0).alias("_k")]).unique()])
        self.intern(found[0]["_name"].to_list())
        names = list(self.event_iids)
        if keys:
            tracks = found[1].with_columns(_uuid=pl.Series(
                [uuid(k) for k in found[1].iter_rows()], dtype=pl.UInt64))
            named = named.join(tracks.lazy(), on=list(keys), how="left",
                               maintain_order="left", nulls_equal=True)
        else:
            named = named.with_columns(_uuid=pl.lit(uuid(()), pl.UInt64))
        df = (named.select(
            "ts_ns", "_uuid", *args,
            _iid=pl.col("_name").replace_strict(names, list(self.event_iids.values()),
                                                return_dtype=pl.UInt32),
            _lat=pl.col("latency_ns") if slices else pl.lit(None, pl.Int64))
            .sort("ts_ns", maintain_order=True).collect())
        te, t = self.pb.TrackEvent, self.tags
        for batch in df.iter_slices(BATCH_ROWS):
            ts = batch["ts_ns"].to_numpy()
            has_end = batch["_lat"].is_not_null().to_numpy()
            kind = np.where(has_end, te.TYPE_SLICE_BEGIN, te.TYPE_INSTANT)
            cols = [(self.arg_iids[a], batch[a].fill_null(0).to_numpy(),
                     batch[a].is_not_null().to_numpy()) for a in args]
            self.out.write(event_rows(
                t, ts, batch["_uuid"].to_numpy(), kind, batch["_iid"].to_numpy(), cols,
                ts + batch["_lat"].fill_null(0).to_numpy(), has_end))
            self.packets += batch.height + int(has_end.sum())


def render_perfetto(tl: dict[str, Any], out: BinaryIO) -> int:
    """Write the timeline `tl` (`analyses.timeseries.timeline`) as a Perfetto trace;
    returns the number of packets written."""
    w = Writer(out)
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

    w.rows(tl["ioctls"], pl.col("name"), lambda k: _uuid("io", *k), ("pid", "tid"),
           ("size_bytes", "handle", "status", "ret", "latency_ns", "gpu_index"), True)
    w.rows(tl["cuda_calls"], pl.col("func"), lambda k: _uuid("t", *k), ("pid", "tid"),
           ("size_bytes", "ptr", "handle", "result", "latency_ns"), True)

    fault_pids = tl["faults"].select("pid").unique().sort("pid").collect()["pid"].to_list()
    for pid in fault_pids:
        w.track(_uuid("f", pid), "faults", process(pid, None))
    w.rows(tl["faults"], pl.format("fault {} {}", *(pl.col(c).cast(pl.String).fill_null(
        "None") for c in ("source", "access_type"))), lambda k: _uuid("f", *k), ("pid",),
        ("address", "gpu_index"), False)
    mig = _uuid("migrations")
    w.track(mig, "migrations")
    w.rows(tl["migrations"], pl.format("migration {}", pl.col("cause").cast(pl.String)
                                       .fill_null("None")),
           lambda k: mig, (), ("src", "dst", "size_bytes", "address", "pid"), False)
    _counters(w, tl, process)
    return w.packets


def _counters(w: Writer, tl: dict[str, Any], process: Any) -> None:
    bytes_unit = w.pb.CounterDescriptor.UNIT_SIZE_BYTES
    points: list[tuple[int, list[float], list[Any]]] = []

    def series(uuid: int, name: str, parent: int | None, s: dict[str, Any], key: str,
               unit: int | None) -> None:
        w.track(uuid, name, parent, counter={"unit": unit} if unit else {})
        points.append((uuid, s["t_s"], s[key]))

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
    # every counter track is described above; their values follow in one encoding pass
    w.counters(points, tl.get("start_ns", 0))
