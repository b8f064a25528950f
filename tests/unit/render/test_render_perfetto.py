"""`--format perfetto`: a native Perfetto protobuf trace, checked against Perfetto's
published schema (the perfetto_trace.proto message classes the `perfetto` package
ships): it parses as a `Trace`, every track an event names is described, every slice
ends on its own track in nesting order, and the event counts equal the trace's rows.

Perfetto's trace processor is not used: the `perfetto` wheel downloads the
trace_processor_shell binary at run time, and tests run without network.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from gputrace.cli import main
from gputrace.render import perfetto_writer
from gputrace.trace.reader import open_trace
from tests.conftest import FIXTURES

pb = pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")
TRACES = sorted(p.parent for p in FIXTURES.rglob("manifest.json"))


def export(trace: Path, tmp: Path) -> Any:
    out = tmp / "x.perfetto-trace"
    assert main(["analyze", str(trace), "--format", "perfetto", "-o", str(out)]) == 0
    t = pb.Trace()
    t.ParseFromString(out.read_bytes())
    return t


def interned(t: Any) -> tuple[dict[int, str], dict[int, str]]:
    """(event names, debug annotation names) by iid, from the packets' InternedData."""
    events: dict[int, str] = {}
    args: dict[int, str] = {}
    for p in t.packet:
        for e in p.interned_data.event_names:
            assert events.setdefault(e.iid, e.name) == e.name, "iid interned twice"
        for a in p.interned_data.debug_annotation_names:
            assert args.setdefault(a.iid, a.name) == a.name, "iid interned twice"
    return events, args


def event_name(t: Any, e: Any) -> str:
    return str(e.name) if e.HasField("name") else interned(t)[0][e.name_iid]


def check_structure(t: Any) -> dict[int, Any]:
    tracks: dict[int, Any] = {}
    # the first packet clears the incremental state; a packet naming an iid needs it,
    # and the iid was interned by an earlier packet
    assert t.packet[0].sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
    events: set[int] = set()
    args: set[int] = set()
    for p in t.packet:
        events |= {e.iid for e in p.interned_data.event_names}
        args |= {a.iid for a in p.interned_data.debug_annotation_names}
        if p.HasField("track_event"):
            e = p.track_event
            iids = [a.name_iid for a in e.debug_annotations if a.HasField("name_iid")]
            if e.HasField("name_iid") or iids:
                assert p.sequence_flags & pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
            assert not e.HasField("name_iid") or e.name_iid in events
            assert set(iids) <= args
    for p in t.packet:
        if p.HasField("track_descriptor"):
            td = p.track_descriptor
            assert td.uuid not in tracks, "track described twice"
            if td.HasField("parent_uuid"):
                assert td.parent_uuid in tracks, "parent described after child"
            tracks[td.uuid] = td
    ev = [(p.timestamp, i, p.track_event) for i, p in enumerate(t.packet)
          if p.HasField("track_event")]
    open_: dict[int, list[int]] = defaultdict(list)
    for ts, _, e in sorted(ev, key=lambda x: (x[0], x[1])):  # trace processor's stable sort
        assert e.track_uuid in tracks
        if e.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            open_[e.track_uuid].append(ts)
        elif e.type == pb.TrackEvent.TYPE_SLICE_END:
            assert open_[e.track_uuid], "slice end without begin"
            assert open_[e.track_uuid].pop() <= ts
        elif e.type == pb.TrackEvent.TYPE_COUNTER:
            assert tracks[e.track_uuid].HasField("counter")
    assert all(not v for v in open_.values()), "slice never ended"
    for p in t.packet:
        assert p.trusted_packet_sequence_id == 1
    return tracks


def counts(t: Any, tracks: dict[int, Any]) -> Counter[tuple[str, int]]:
    c: Counter[tuple[str, int]] = Counter()
    for p in t.packet:
        if p.HasField("track_event"):
            td = tracks[p.track_event.track_uuid]
            kind = ("thread" if td.HasField("thread") else "counter" if td.HasField("counter")
                    else td.name)
            c[(kind, p.track_event.type)] += 1
    return c


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_fixture_exports_with_row_counts(trace: Path, tmp_path: Path) -> None:
    t = export(trace, tmp_path)
    tracks = check_structure(t)
    c = counts(t, tracks)
    tr = open_trace(trace)

    def rows(name: str, timed: bool) -> int:
        df = tr.scan(name).select("latency_ns").collect()
        return df.filter(pl.col("latency_ns").is_not_null() == timed).height

    B, E, INST = (pb.TrackEvent.TYPE_SLICE_BEGIN, pb.TrackEvent.TYPE_SLICE_END,
                  pb.TrackEvent.TYPE_INSTANT)
    assert c[("ioctls", B)] == c[("ioctls", E)] == rows("ioctls", True)
    assert c[("ioctls", INST)] == rows("ioctls", False)
    assert c[("thread", B)] == c[("thread", E)] == rows("cuda_calls", True)
    assert c[("thread", INST)] == rows("cuda_calls", False)
    assert c[("faults", INST)] == tr.scan("faults").select(pl.len()).collect().item()
    assert c[("migrations", INST)] == tr.scan("migrations").select(pl.len()).collect().item()


def test_exact_values_of_the_default_fixture(tmp_path: Path) -> None:
    t = export(FIXTURES / "default", tmp_path)
    tracks = check_structure(t)
    io = (open_trace(FIXTURES / "default").scan("ioctls").sort("ts_ns").collect()
          .row(0, named=True))
    first = next(p for p in t.packet if p.HasField("track_event")
                 and tracks[p.track_event.track_uuid].name == "ioctls")
    assert first.timestamp == io["ts_ns"] and event_name(t, first.track_event) == io["name"]
    keys = interned(t)[1]
    args = {keys[a.name_iid]: a for a in first.track_event.debug_annotations}
    assert args["latency_ns"].int_value == io["latency_ns"]
    assert args["handle"].int_value == io["h_object"]
    procs = {td.process.pid: td.process.process_name for td in tracks.values()
             if td.HasField("process")}
    assert procs[4242] == "train.py"
    # live bytes counters: api of train.py peaks at 74 MiB (the summary's peak)
    live = [u for u, td in tracks.items() if td.name == "live bytes api"
            and tracks[td.parent_uuid].process.pid == 4242]
    vals = [p.track_event.double_counter_value for p in t.packet
            if p.HasField("track_event") and p.track_event.track_uuid in live]
    assert max(vals) == 74 * 1024 * 1024
    gpu = [u for u, td in tracks.items() if td.name == "GPU 0 bytes in use"]
    assert gpu and tracks[gpu[0]].counter.unit == pb.CounterDescriptor.UNIT_SIZE_BYTES


def test_perfetto_needs_an_output_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(FIXTURES / "default"), "--format", "perfetto"]) == 2
    assert "give -o FILE" in capsys.readouterr().err


def test_varint_matches_protobuf() -> None:
    from google.protobuf.internal.encoder import _VarintBytes

    from gputrace.render.perfetto_wire import varint

    for n in [0, 1, 127, 128, 300, 2**35 + 5, 10**12, 2**63 - 1, *(3**k for k in range(40))]:
        assert varint(n) == _VarintBytes(n)
    assert varint(-1) == _VarintBytes(2**64 - 1)


def test_column_encoding_equals_protobufs() -> None:
    """Synthetic rows (nulls, negatives, 64-bit values) encoded a column at a time parse
    to the same messages as protobuf's own encoder makes from the same values."""
    import numpy as np

    from gputrace.render.perfetto_wire import Tags, event_rows, varints

    rng = np.random.default_rng(7)
    n = 500
    ts = rng.integers(0, 2**62, n)
    lat = rng.integers(0, 10**9, n)
    has_end = rng.random(n) < 0.7
    kind = np.where(has_end, pb.TrackEvent.TYPE_SLICE_BEGIN, pb.TrackEvent.TYPE_INSTANT)
    uuid = rng.integers(1, 2**63, n, dtype=np.uint64)
    iid = rng.integers(1, 300, n)
    big = rng.integers(0, 2**64, n, dtype=np.uint64)
    neg = rng.integers(-(2**40), 2**40, n)
    small = rng.integers(-1, 4, n).astype(np.int16)
    args = [(1, big, rng.random(n) < 0.8), (2, neg, rng.random(n) < 0.5),
            (300, small, np.ones(n, bool))]
    out = pb.Trace()
    out.ParseFromString(event_rows(Tags(pb), ts, uuid, kind, iid, args, ts + lat, has_end))
    want = pb.Trace()
    for i in range(n):
        p = want.packet.add(timestamp=int(ts[i]), trusted_packet_sequence_id=1,
                            sequence_flags=pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE)
        e = p.track_event
        e.type, e.track_uuid, e.name_iid = int(kind[i]), int(uuid[i]), int(iid[i])
        for key, values, present in args:
            if present[i]:
                v = int(values[i])
                e.debug_annotations.add(name_iid=key, int_value=v - 2**64 if v >= 2**63 else v)
        if has_end[i]:
            want.packet.add(timestamp=int(ts[i] + lat[i]), trusted_packet_sequence_id=1,
                            track_event={"type": pb.TrackEvent.TYPE_SLICE_END,
                                         "track_uuid": int(uuid[i])})
    assert out == want
    lens, data = varints(np.array([0, 127, 128, -1, 2**63 - 1]))
    assert [bytes(d[:k]) for k, d in zip(lens, data, strict=True)] == [
        b"\x00", b"\x7f", b"\x80\x01", b"\xff" * 9 + b"\x01", b"\xff" * 8 + b"\x7f"]


RANGES_PER_TABLE = 100
"""Time ranges each table is cut into below: a few rows each on the small fixtures, about
this many on the real captures. Every cut takes the same code path; cutting the largest
real capture every 3 rows (about 5,900 ranges) took a minute of the suite's time."""


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_rows_by_time_range_give_the_same_bytes(trace: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows sorted and encoded a few at a time (as on large traces) give the same file,
    byte for byte, as each table in one piece."""
    out = tmp_path / "x.perfetto-trace"
    assert main(["analyze", str(trace), "--format", "perfetto", "-o", str(out)]) == 0
    whole = out.read_bytes()
    cut = perfetto_writer.time_ranges

    def a_few_rows_each(frame: pl.LazyFrame, rows: int | None = None,
                        bins: int = 4096) -> list[pl.Expr]:  # fmt: skip
        n = frame.select(pl.len()).collect().item()
        return cut(frame, max(3, n // RANGES_PER_TABLE), bins)

    monkeypatch.setattr(perfetto_writer, "time_ranges", a_few_rows_each)
    assert main(["analyze", str(trace), "--format", "perfetto", "-o", str(out)]) == 0
    assert out.read_bytes() == whole


def test_time_ranges_cover_each_row_once_in_order() -> None:
    """Consecutive ranges, each sorted apart, are the whole table's stable sort by time
    (null times first, ties in table order), and none is much over its row budget."""
    ts = [None if i % 17 == 0 else (i * 37) % 500 // 3 for i in range(400)]
    frame = pl.DataFrame({"ts_ns": ts, "row": range(len(ts))}).lazy()
    ranges = perfetto_writer.time_ranges(frame, rows=40, bins=64)
    parts = [frame.filter(r).sort("ts_ns", maintain_order=True).collect() for r in ranges]
    assert len(ranges) >= 10
    assert max(p.height for p in parts) <= 40 + 24  # nulls and one bin over at most
    assert pl.concat(parts).equals(frame.sort("ts_ns", maintain_order=True).collect())
    assert len(perfetto_writer.time_ranges(frame, rows=len(ts))) == 1
