"""Joining a PyTorch snapshot to a recording of the same process (`import --into`).

Two facts tie them, and both must hold or the join is refused with one line:

- Addresses: each segment of the caching allocator is one `cudaMalloc`, which the API
  layer recorded as a successful `cuMemAlloc*` returning the segment's address. At
  least one segment's address must be such a pointer; the process of those calls is
  the snapshot's (the most matched one, when several processes reused an address).
- Time: a trace entry's `time_us` is CLOCK_REALTIME (Unix-epoch µs, PyTorch's
  `getTime()`); a recording stamps CLOCK_MONOTONIC ns and its manifest holds
  `clock.realtime_offset_ns` (Unix-epoch ns minus CLOCK_MONOTONIC ns, measured when
  recording started). `ts_ns = time_us * 1000 - realtime_offset_ns` puts an entry on the
  recording's clock. Every entry must then fall inside the recording's span, give or
  take `SLACK_NS` (the wall clock may be slewed by NTP during a long recording).

The joined trace is written to a new directory: the recording's tables copied part for
part, plus the allocator tables; the recording itself is never touched.

A recording whose allocator layer was recorded live (the torch_allocator recorder
layer) keeps its rows: the snapshot's rows are added as parts of their own, named in
the manifest's `imported` entry (`allocator_sources`), so the analyses read one source
at a time and analyses/allocator/lineup.py compares the two. The origin is kept per
part, not per row: the live layer builds its rows from the tables' column list, so a
new column would have to be filled there too.
"""

from __future__ import annotations

import errno
import os
import stat
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gputrace import schema
from gputrace.errors import GputraceError, UsageError
from gputrace.importers.torch_snapshot import TorchSnapshot, append_tables, import_record

SLACK_NS = 1_000_000_000
"""How far outside the recording an entry may be stamped and still join: wall-clock
corrections during a recording move CLOCK_REALTIME against CLOCK_MONOTONIC."""

ALLOC_FUNCS = ("cuMemAlloc_v2", "cuMemAlloc", "cuMemAllocPitch_v2", "cuMemAllocPitch",
               "cuMemAllocAsync", "cuMemAllocFromPoolAsync")
"""API calls that hand out a pointer the caching allocator may take as a segment."""

# manifest keys the writer owns: the joined trace gets its own
_WRITER_KEYS = ("format", "format_version", "schema_version", "gputrace_version", "status",
                "tables")


class JoinRefused(GputraceError):
    """The snapshot and the recording do not line up."""


@dataclass(frozen=True)
class Join:
    """How the snapshot lines up with the recording."""

    pid: int
    offset_ns: int
    api_ts: dict[int, int]
    """Segment address -> ts_ns of the cuMemAlloc* call that returned it."""
    segments: int
    live: bool = False
    """The recording's allocator layer was recorded live: its rows are kept beside the
    snapshot's."""


def _utc(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).isoformat(timespec="milliseconds")


def line_up(snap: TorchSnapshot, trace: Any) -> Join:
    """Where the snapshot's segments and entries fall in the recording `trace` (an open
    gputrace.trace.reader.Trace), or JoinRefused saying what does not line up."""
    import polars as pl

    m = trace.manifest
    where = str(trace.path)
    if any((e or {}).get("layer") == "allocator" for e in m.get("imported") or []):
        raise JoinRefused(f"refused: {where} already holds an imported allocator layer")
    live = "allocator" in trace.layers  # recorded live: kept, the snapshot's rows added
    if "api" not in trace.layers and not live:
        raise JoinRefused(f"refused: {where} has no API layer (cuMemAlloc calls) to join "
                          "the snapshot's segments to; record with the api layer")
    offset = (m.get("clock") or {}).get("realtime_offset_ns")
    start, end = m.get("start_ts_ns"), m.get("end_ts_ns")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (offset, start, end)):
        raise JoinRefused(f"refused: {where} lacks clock.realtime_offset_ns or its time span; "
                          "the snapshot's wall-clock times cannot be placed in it")
    assert isinstance(offset, int) and isinstance(start, int) and isinstance(end, int)
    seg_addr = snap.rows.segments["address"]
    wanted = sorted(set(seg_addr))
    calls = (trace.scan("cuda_calls")
             .filter(pl.col("func").is_in(ALLOC_FUNCS) & (pl.col("result") == 0)
                     & pl.col("ptr").is_in(wanted))
             .select("ptr", "pid", "ts_ns"))
    if live:  # the live layer's own segment allocations join by address as well
        calls = pl.concat([calls, trace.scan("allocator_events")
                           .filter((pl.col("action") == "segment_alloc")
                                   & pl.col("address").is_in(wanted))
                           .select(pl.col("address").alias("ptr"), "pid", "ts_ns")
                           .cast({"ptr": pl.UInt64, "pid": pl.Int32, "ts_ns": pl.Int64})])
    calls = calls.cast({"ptr": pl.UInt64, "pid": pl.Int32, "ts_ns": pl.Int64}
                       ).sort("ts_ns").collect()
    by_ptr: dict[int, list[tuple[int, int]]] = {}
    for ptr, pid, ts in calls.iter_rows():
        by_ptr.setdefault(int(ptr), []).append((int(ts), int(pid)))
    pids = Counter(pid for ptr in set(seg_addr) for _, pid in by_ptr.get(ptr, ()))
    if not pids:
        raise JoinRefused(
            f"refused: none of the snapshot's {len(seg_addr)} segment addresses was returned "
            f"by a cuMemAlloc call{' or live allocator segment' if live else ''} in "
            f"{where}; not a recording of the snapshot's process")
    pid = pids.most_common(1)[0][0]
    span = snap.rows.time_us_span
    if span is not None:
        lo, hi = span[0] * 1000 - offset, span[1] * 1000 - offset
        if lo < start - SLACK_NS or hi > end + SLACK_NS:
            raise JoinRefused(
                f"refused: the snapshot's trace entries ({_utc(lo + offset)} to "
                f"{_utc(hi + offset)}) fall outside the recording {where} "
                f"({_utc(start + offset)} to {_utc(end + offset)}); not the same run")
    # the latest allocation of each address by that process: addresses are reused
    api_ts: dict[int, int] = {}
    for ptr in set(seg_addr):
        mine = [ts for ts, p in by_ptr.get(ptr, ()) if p == pid]
        if mine:
            api_ts[ptr] = mine[-1]
    return Join(pid, offset, api_ts, len(seg_addr), live)


def _read_part(part: Path) -> Any:
    """A part of the recording, opened without following a link: run as root on
    another user's trace, a part that is a symbolic link to a root-only file would
    otherwise copy that file's rows into the joined trace."""
    try:
        fd = os.open(part, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        why = "a symbolic link" if e.errno == errno.ELOOP else (e.strerror or str(e))
        raise JoinRefused(f"refused: {part} is {why}; a part is read only as a "
                          "regular file") from None
    import pyarrow as pa
    import pyarrow.parquet as pq

    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise JoinRefused(f"refused: {part} is not a regular file")
        try:
            return pq.read_table(f)
        except (OSError, pa.ArrowException) as e:  # as Trace.read_part says it
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise JoinRefused(f"corrupt Parquet part {part}: {reason}") from None


def write_joined(snap: TorchSnapshot, recording: str | os.PathLike[str],
                 out: str | os.PathLike[str], *, force: bool = False) -> tuple[Path, Join]:
    """Write the recording plus the snapshot's allocator tables to `out`."""
    from gputrace.trace.reader import in_current_schema, open_trace
    from gputrace.trace.writer import TraceWriter

    if Path(out).resolve() == Path(recording).resolve():
        raise UsageError("-o must name a new directory: the recording is never rewritten")
    trace = open_trace(recording)
    join = line_up(snap, trace)
    rows = snap.rows
    rows.place(join.offset_ns, join.pid)
    rows.segments["api_alloc_ts_ns"] = [join.api_ts.get(a) for a in rows.segments["address"]]
    tables = rows.tables()
    if join.live:
        tables = _past_live_stacks(tables, trace)
    manifest = {k: v for k, v in trace.manifest.items() if k not in _WRITER_KEYS}
    manifest["layers"] = [*trace.layers, *([] if join.live else ["allocator"])]
    record = import_record(snap, joined=True, pid=join.pid, segments=join.segments,
                           segments_matched=len(join.api_ts))
    manifest["imported"] = [*(manifest.get("imported") or []), record]
    w = TraceWriter(out, manifest=manifest, force=force)
    try:
        for name in schema.TABLES:
            for part in trace.parts(name):  # one part in, one part out: bounded memory
                # no link followed; older schema versions too: missing nullable
                # columns as nulls
                w.append(name, in_current_schema(schema.table(name), _read_part(part), part))
                w.rotate()
        before = {name: _part_names(w.path / name) for name in tables}
        names = list(tables)
        rows.event_chunks = []
        append_tables(w, tables)
        w.rotate()
        if join.live:  # which parts are the snapshot's: the analyses pick a source by them
            record["allocator_sources"] = {
                "live": "the torch_allocator recorder layer",
                "snapshot_parts": {name: sorted(_part_names(w.path / name) - before[name])
                                   for name in names}}
            w.update_manifest(imported=manifest["imported"])
    except BaseException:
        w.close(status="incomplete")
        raise
    w.close(status=trace.status)
    return w.path, join


def _part_names(folder: Path) -> set[str]:
    from gputrace.trace.files import PART_GLOB

    return {p.name for p in folder.glob(PART_GLOB)} if folder.is_dir() else set()


def _past_live_stacks(tables: dict[str, Any], trace: Any) -> dict[str, Any]:
    """The snapshot's tables with stack ids moved past the live layer's: both sources'
    frames share allocator_frames, keyed by stack id."""
    import polars as pl
    import pyarrow.compute as pc

    top = trace.scan("allocator_frames").select(pl.col("stack_id").max()).collect().item()
    shift = int(top or 0)
    if not shift:
        return tables
    out = {}
    for name, t in tables.items():
        i = t.schema.get_field_index("stack_id")
        out[name] = t.set_column(i, "stack_id", pc.add(t.column("stack_id"), shift)
                                 .cast(t.schema.field(i).type))
    return out
