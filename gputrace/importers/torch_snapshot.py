"""PyTorch CUDA caching-allocator memory snapshots -> the `allocator` layer.

A snapshot (`torch.cuda.memory._dump_snapshot`, or `pickle.dump` of
`torch.cuda.memory._snapshot()`) is a pickled dict:

- `segments`: each with `device`, `address`, `total_size`, `allocated_size`,
  `active_size`, `requested_size`, `stream`, `segment_type` (`large`/`small`),
  `segment_pool_id`, `is_expandable`, `frames`, and `blocks` (`address`, `size`,
  `requested_size`, `state`, `frames`);
- `device_traces`: one list per device of trace entries (`action`, `addr` — or
  `device_free` for `oom` —, `size`, `stream`, `time_us` since the Unix epoch, and
  `frames` when the history recorded stacks);
- `allocator_settings`, `external_annotations` (kept in the manifest, in short).

Older formats, and the list of segments `torch.cuda.memory_snapshot()` returns, are
read too (torch_rows). `read_snapshot` checks the shape and turns it into the rows of
the four allocator tables (gputrace.schema.allocator); anything else is one line
naming what is wrong. Writing the trace (alone, or joined to a recording) is
`write_alone` / torch_join.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa

from gputrace.importers.pickle_stream import Fallback, StreamReader
from gputrace.importers.safe_pickle import Loaded, load_plain, load_with
from gputrace.importers.torch_entries import trace_rows
from gputrace.importers.torch_rows import AllocatorRows, SnapshotError, segment_rows, text
from gputrace.importers.torch_stream import SnapshotSink

__all__ = ["KIND", "AllocatorRows", "SnapshotError", "TorchSnapshot", "check_top",
           "import_record", "read_snapshot", "snapshot_rows", "write_alone"]

KIND = "torch-snapshot"
T = TypeVar("T")
MAX_SETTINGS = 64
"""Most allocator settings kept in the manifest (PyTorch has about 15)."""


def check_top(value: Any, name: str) -> dict[str, Any]:
    """The snapshot dict (a bare list of segments becomes one without history), or
    SnapshotError saying what the file holds instead."""
    if isinstance(value, list):  # torch.cuda.memory_snapshot(): the segments alone
        return {"segments": value, "device_traces": [], "_segments_only": True}
    if not isinstance(value, dict):
        raise SnapshotError(f"{name} holds {type(value).__name__}, not a PyTorch memory "
                            "snapshot (a dict with segments and device_traces)")
    if "segments" not in value:
        raise SnapshotError(f"{name} lacks 'segments': not a PyTorch memory snapshot "
                            "(torch.cuda.memory._dump_snapshot)")
    return value


def _settings(v: Any) -> dict[str, Any] | None:
    """The allocator settings as plain scalars (nested maps as their text), bounded."""
    if not isinstance(v, dict):
        return None
    out: dict[str, Any] = {}
    for k, x in list(v.items())[:MAX_SETTINGS]:
        if not isinstance(k, str):
            continue
        plain_int = isinstance(x, int) and abs(x) < 1 << 62
        finite = isinstance(x, float) and x == x and abs(x) < 1e300
        if plain_int or finite:
            out[text(k)[:100]] = x
        elif isinstance(x, str):
            out[text(k)[:100]] = text(x)[:200]
    return out


def snapshot_rows(snap: dict[str, Any], sink: SnapshotSink | None = None) -> AllocatorRows:
    """The allocator tables' rows of a checked snapshot dict. Consumes it as it goes
    (each container emptied once read: a big history is not held twice). With `sink`,
    the histories were read into rows while the file was read (torch_stream)."""
    rows = AllocatorRows()
    segments = snap["segments"]
    if not isinstance(segments, list):
        raise SnapshotError(f"segments is {type(segments).__name__}, not a list")
    segment_rows(rows, segments)
    if snap.get("_segments_only"):
        rows.note("the list of segments alone (torch.cuda.memory_snapshot()): no trace "
                  "entries, no allocator settings")
    elif "device_traces" not in snap:
        rows.note("no device_traces: no history")
    traces = snap.get("device_traces", [])
    if not isinstance(traces, list):
        raise SnapshotError(f"device_traces is {type(traces).__name__}, not a list")
    if sink is not None and sink.outer is not None and traces is sink.outer:
        sink.finish(rows, traces)
    else:
        trace_rows(rows, traces)
    if rows.event_count == 0 and not snap.get("_segments_only"):
        rows.note("no trace entries: the state when the snapshot was taken, no history "
                  "(history not recorded, or an out-of-memory observer's dump)")
    return rows


@dataclass(frozen=True)
class TorchSnapshot:
    """A read snapshot: its rows and facts about its file."""

    rows: AllocatorRows
    name: str
    sha256: str
    bytes: int
    compression: str
    facts: dict[str, Any]
    """notes (what the format lacks), allocator settings, annotations: for the manifest."""


@contextlib.contextmanager
def system_pool() -> Iterator[None]:
    """Arrow's allocations from the C library's malloc while an import runs: pyarrow's
    default (mimalloc) returns the memory of each run's tables to the kernel and faults
    it back in for the next; at 10^7 entries that cost 4 s of the import's 12.7 s
    CPU (benchmarks/README.md). The heap's free pages go back to the kernel after."""
    before = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())
    try:
        yield
    finally:
        pa.set_memory_pool(before)
        _trim_heap()


def _trim_heap() -> None:
    """Give the C heap's free pages back to the kernel (glibc keeps them: after a
    10^7-entry import 0.9 GB of freed rows stayed resident for whatever the process
    did next, the reports of the same run). Not glibc: nothing to do."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


def read_snapshot(path: str | os.PathLike[str], *, stream: bool = True) -> TorchSnapshot:
    """Read the snapshot at `path` with the restricted unpickler and check its shape.
    `stream=False`: the reference reader (the whole pickle unpickled, then walked)."""
    name = Path(path).name
    try:  # the histories read as a stream of opcodes, never held
        if not stream:
            raise Fallback("the reference reader asked for")
        sink = SnapshotSink()
        loaded: Loaded = _named(name, load_with, path,
                                lambda f: StreamReader(f, sink).load())
        snap = check_top(loaded.value, name)
        rows = _named(name, snapshot_rows, snap, sink)
    except Fallback:  # what the stream reader leaves to the reference reader
        loaded = load_plain(path)
        snap = check_top(loaded.value, name)
        rows = _named(name, snapshot_rows, snap)
    settings = _settings(snap.get("allocator_settings"))
    ann = snap.get("external_annotations")
    more: dict[str, Any] = {"notes": rows.notes}
    if settings is not None:
        more["allocator_settings"] = settings
    if isinstance(ann, list):
        more["external_annotations"] = len(ann)
    return TorchSnapshot(rows, name, loaded.sha256, loaded.bytes, loaded.compression,
                         more)


def _named(name: str, fn: Callable[..., T], *args: Any) -> T:
    """fn(*args), its SnapshotError naming the file."""
    try:
        return fn(*args)
    except SnapshotError as e:
        msg = str(e)
        if msg.startswith("refused: "):
            raise SnapshotError(f"refused: {name}: {msg[9:]}") from None
        raise SnapshotError(f"{name}: {msg}") from None


def import_record(snap: TorchSnapshot, **more: Any) -> dict[str, Any]:
    """The manifest's `imported` entry for this snapshot."""
    from gputrace.trace.writer import _version

    return {"kind": KIND, "layer": "allocator", "file": snap.name, "sha256": snap.sha256,
            "bytes": snap.bytes, "compression": snap.compression,
            "gputrace_version": _version(), "unix_s": time.time(), **snap.facts, **more}


def write_alone(snap: TorchSnapshot, out: str | os.PathLike[str], *, force: bool = False) -> Path:
    """Write the snapshot as a trace of its own: ts_ns are Unix-epoch ns."""
    from gputrace.trace.writer import TraceWriter

    snap.rows.place(0, None)
    span = snap.rows.time_us_span
    manifest: dict[str, Any] = {
        "layers": ["allocator"],
        "clock": {"realtime_offset_ns": 0, "source": "unix-epoch"},
        "imported": [import_record(snap, joined=False)],
    }
    if span is not None:
        manifest.update(start_ts_ns=span[0] * 1000, end_ts_ns=span[1] * 1000)
    w = TraceWriter(out, manifest=manifest, force=force)
    try:
        append_tables(w, snap.rows.tables())
        snap.rows.event_chunks = []
    except BaseException:
        w.close(status="incomplete")
        raise
    w.close()
    return w.path


def append_tables(w: Any, tables: dict[str, pa.Table]) -> None:
    """Append `tables` to the TraceWriter `w` a record batch at a time, each table's
    batches let go as they are appended: a whole 10^7-entry table handed over at once
    would be copied into one (its size again in memory at the peak)."""
    for name in list(tables):
        batches = tables.pop(name).to_batches()
        batches.reverse()
        while batches:
            w.append(name, batches.pop())
