"""How are tracks and rows streamed to a file as Perfetto TracePackets?

Track descriptors and interned names are built with the message classes the
`perfetto` PyPI package ships (generated from Perfetto's published
perfetto_trace.proto); the packets of the rows (one or two per row) are encoded
a column at a time (`perfetto_wire`) in batches of `BATCH_ROWS` and written as
`Trace.packet` entries (field 1, length-delimited). Event and argument names are
interned (`InternedData`; the first packet clears the incremental state, the
packets naming iids need it).
"""

from __future__ import annotations

import functools
import itertools
import zlib
from collections.abc import Callable
from typing import Any, BinaryIO

import numpy as np
import polars as pl

from gputrace.render.perfetto_wire import SEQ, Tags, counter_rows, event_rows, len_bytes

BATCH_ROWS = 65_536
"""Rows encoded at once: numpy buffers of tens of MiB, whatever the trace's size."""


RANGE_ROWS = 4_000_000
"""Rows sorted and encoded at once: a time range of the table, not all of it."""


ARGS = ("size_bytes", "handle", "status", "ret", "latency_ns", "gpu_index", "ptr", "result",
        "address", "src", "dst", "pid")
"""Debug annotation names, interned once at the start of the sequence."""


def _pb() -> Any:
    from perfetto.protos.perfetto.trace import (  # type: ignore[import-untyped]
        perfetto_trace_pb2,
    )

    return perfetto_trace_pb2


@functools.lru_cache(maxsize=65_536)
def track_uuid(*parts: object) -> int:
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
            tracks = found[1].with_columns(track_uuid=pl.Series(
                [uuid(k) for k in found[1].iter_rows()], dtype=pl.UInt64))
            named = named.join(tracks.lazy(), on=list(keys), how="left",
                               maintain_order="left", nulls_equal=True)
        else:
            named = named.with_columns(track_uuid=pl.lit(uuid(()), pl.UInt64))
        sel = named.select(
            "ts_ns", "track_uuid", *args,
            _iid=pl.col("_name").replace_strict(names, list(self.event_iids.values()),
                                                return_dtype=pl.UInt32),
            _lat=pl.col("latency_ns") if slices else pl.lit(None, pl.Int64))
        # one time range at a time, each sorted apart: the same rows in the same order
        # as one stable sort of the whole table, with a range's rows in memory, not all
        for span in time_ranges(frame):
            df = sel.filter(span).sort("ts_ns", maintain_order=True).collect()
            self._encode(df, args)
            del df

    def _encode(self, df: pl.DataFrame, args: tuple[str, ...]) -> None:
        te, t = self.pb.TrackEvent, self.tags
        for batch in df.iter_slices(BATCH_ROWS):
            ts = batch["ts_ns"].to_numpy()
            has_end = batch["_lat"].is_not_null().to_numpy()
            kind = np.where(has_end, te.TYPE_SLICE_BEGIN, te.TYPE_INSTANT)
            cols = [(self.arg_iids[a], batch[a].fill_null(0).to_numpy(),
                     batch[a].is_not_null().to_numpy()) for a in args]
            self.out.write(event_rows(
                t, ts, batch["track_uuid"].to_numpy(), kind, batch["_iid"].to_numpy(), cols,
                ts + batch["_lat"].fill_null(0).to_numpy(), has_end))
            self.packets += batch.height + int(has_end.sum())


def time_ranges(frame: pl.LazyFrame, rows: int | None = None,
                bins: int = 4096) -> list[pl.Expr]:
    """Filters cutting `frame` into consecutive `ts_ns` ranges of about `rows` rows
    (default `RANGE_ROWS`; from a histogram of `bins` equal bins, so a range holds at
    least one bin); null times go with the first range (where a sort puts them)."""
    ts = pl.col("ts_ns")
    lo, hi, n = frame.select(ts.min(), ts.max().alias("hi"), pl.len()).collect().row(0)
    limit = rows or RANGE_ROWS
    if lo is None or n <= limit:
        return [pl.lit(True)]
    width = -(-(hi - lo + 1) // bins)
    hist = (frame.select(((ts - lo) // width).alias("b")).drop_nulls().group_by("b")
            .len().sort("b").collect())
    cuts, held = [], 0
    for b, count in hist.iter_rows():
        if held and held + count > limit:
            cuts.append(lo + b * width)
            held = 0
        held += count
    if not cuts:
        return [pl.lit(True)]
    first, last = [ts.is_null() | (ts < cuts[0])], [ts >= cuts[-1]]
    return first + [(ts >= a) & (ts < b) for a, b in itertools.pairwise(cuts)] + last
