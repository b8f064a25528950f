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
- `allocator_settings`, `external_annotations` (not imported).

`read_snapshot` checks that shape and turns it into the rows of the four allocator
tables (gputrace.schema.allocator); anything else is one line naming what is wrong.
Writing the trace (alone, or joined to a recording) is `write_import`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from gputrace import schema
from gputrace.errors import GputraceError
from gputrace.importers.safe_pickle import Loaded, load_plain

KIND = "torch-snapshot"
U64_MAX = (1 << 64) - 1
I64_MAX = (1 << 63) - 1
_ACTIONS = {v: k for k, v in schema.ALLOCATOR_ACTIONS.items()}
_STATES = {v: k for k, v in schema.BLOCK_STATES.items()}
# older PyTorch documentation spells the pending state this way
_STATES["active_awaiting_free"] = _STATES["active_pending_free"]


class SnapshotError(GputraceError):
    """The file is not a PyTorch memory snapshot gputrace can read."""


Frame = tuple[str | None, str | None, int | None]


@dataclass
class AllocatorRows:
    """The rows of the allocator tables, column by column (Python lists), before the
    snapshot's clock is placed: events carry `time_us`, `ts_ns` is set by `place`."""

    segments: dict[str, list[Any]] = field(
        default_factory=lambda: _columns(schema.ALLOCATOR_SEGMENTS))
    blocks: dict[str, list[Any]] = field(
        default_factory=lambda: _columns(schema.ALLOCATOR_BLOCKS))
    events: dict[str, list[Any]] = field(
        default_factory=lambda: _columns(schema.ALLOCATOR_EVENTS))
    stacks: dict[tuple[Frame, ...], int] = field(default_factory=dict)

    def stack_id(self, frames: list[Frame]) -> int | None:
        """The id of this list of frames (one per distinct list, from 1); None when empty."""
        if not frames:
            return None
        key = tuple(frames)
        return self.stacks.setdefault(key, len(self.stacks) + 1)

    def place(self, offset_ns: int, pid: int | None) -> None:
        """Set events' ts_ns to time_us in ns minus `offset_ns` (the recording's
        realtime offset; 0 for Unix-epoch ns), and every row's pid."""
        self.events["ts_ns"] = [t * 1000 - offset_ns for t in self.events["time_us"]]
        for cols in (self.segments, self.blocks, self.events):
            cols["pid"] = [pid] * len(cols["device"])

    def tables(self) -> dict[str, pa.Table]:
        """The four tables, typed by the schema."""
        frames = _columns(schema.ALLOCATOR_FRAMES)
        for key, sid in self.stacks.items():
            for depth, (function, filename, line) in enumerate(key):
                for c, v in zip(("stack_id", "depth", "function", "filename", "line"),
                                (sid, depth, function, filename, line), strict=True):
                    frames[c].append(v)
        out = {}
        for t, cols in ((schema.ALLOCATOR_SEGMENTS, self.segments),
                        (schema.ALLOCATOR_BLOCKS, self.blocks),
                        (schema.ALLOCATOR_EVENTS, self.events),
                        (schema.ALLOCATOR_FRAMES, frames)):
            out[t.name] = pa.Table.from_pydict(cols, schema=t.arrow_schema)
        return out

    def time_us_span(self) -> tuple[int, int] | None:
        ts = self.events["time_us"]
        return (min(ts), max(ts)) if ts else None


def _columns(t: schema.Table) -> dict[str, list[Any]]:
    return {c.name: [] for c in t.columns}


# ------------------------------------------------------------------ checking


def _where(*path: object) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _int(d: dict[str, Any], key: str, where: str, *, lo: int = 0, hi: int = U64_MAX,
         default: int | None = None, required: bool = True) -> int | None:
    if key not in d:
        if required and default is None:
            raise SnapshotError(f"{where} lacks {key!r}")
        return default
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise SnapshotError(f"{where}.{key} is {type(v).__name__}, not an integer")
    if not lo <= v <= hi:
        raise SnapshotError(f"{where}.{key} = {v} is out of range")
    return v


def _str(d: dict[str, Any], key: str, where: str, default: str | None = None) -> str | None:
    v = d.get(key, default)
    if v is None or isinstance(v, str):
        return v
    raise SnapshotError(f"{where}.{key} is {type(v).__name__}, not a string")


def _dict(v: Any, where: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise SnapshotError(f"{where} is {type(v).__name__}, not a dict")
    return v


def _list(v: Any, where: str) -> list[Any]:
    if not isinstance(v, list):
        raise SnapshotError(f"{where} is {type(v).__name__}, not a list")
    return v


def _frames(d: dict[str, Any], where: str) -> list[Frame]:
    out: list[Frame] = []
    for i, f in enumerate(_list(d.get("frames", []), f"{where}.frames")):
        w = f"{where}.frames[{i}]"
        f = _dict(f, w)
        line = _int(f, "line", w, lo=-(1 << 31), hi=(1 << 31) - 1, required=False)
        out.append((_str(f, "name", w), _str(f, "filename", w), line))
    return out


def _pool_id(v: Any, where: str) -> str | None:
    if v is None:
        return None
    if isinstance(v, (list, tuple)) and all(isinstance(x, int) and not isinstance(x, bool)
                                            for x in v):
        return ",".join(str(x) for x in v)
    raise SnapshotError(f"{where}.segment_pool_id is not a pair of integers")


# ------------------------------------------------------------------ reading


def check_top(value: Any, name: str) -> dict[str, Any]:
    """The snapshot dict, or SnapshotError saying what the file holds instead."""
    if isinstance(value, list):
        raise SnapshotError(
            f"{name} holds a list, not a PyTorch memory snapshot (a dict with segments and "
            "device_traces); torch.cuda.memory_snapshot() returns the segments alone: save "
            "torch.cuda.memory._snapshot(), or use torch.cuda.memory._dump_snapshot()")
    if not isinstance(value, dict):
        raise SnapshotError(f"{name} holds {type(value).__name__}, not a PyTorch memory "
                            "snapshot (a dict with segments and device_traces)")
    for key in ("segments", "device_traces"):
        if key not in value:
            raise SnapshotError(f"{name} lacks {key!r}: not a PyTorch memory snapshot "
                                "(torch.cuda.memory._dump_snapshot)")
    return value


def snapshot_rows(snap: dict[str, Any]) -> AllocatorRows:
    """The allocator tables' rows of a checked snapshot dict. Consumes its trace lists
    (each is emptied once converted, so a big history is not held twice)."""
    rows = AllocatorRows()
    seg_cols, blk_cols, ev_cols = rows.segments, rows.blocks, rows.events
    for i, seg in enumerate(_list(snap["segments"], "segments")):
        w = _where("segments", i)
        seg = _dict(seg, w)
        device = _int(seg, "device", w, hi=(1 << 15) - 1)
        address = _int(seg, "address", w)
        pool = _str(seg, "segment_type", w)
        if pool not in ("large", "small"):
            raise SnapshotError(f"{w}.segment_type is {pool!r}, not 'large' or 'small'")
        expandable = seg.get("is_expandable")
        seg_cols["device"].append(device)
        seg_cols["address"].append(address)
        for col, key in (("total_size_bytes", "total_size"),
                         ("allocated_size_bytes", "allocated_size"),
                         ("active_size_bytes", "active_size"),
                         ("requested_size_bytes", "requested_size")):
            seg_cols[col].append(_int(seg, key, w))
        seg_cols["stream"].append(_int(seg, "stream", w, default=0))
        seg_cols["pool"].append(pool)
        seg_cols["pool_id"].append(_pool_id(seg.get("segment_pool_id"), w))
        seg_cols["is_expandable"].append(expandable if isinstance(expandable, bool) else None)
        seg_cols["stack_id"].append(rows.stack_id(_frames(seg, w)))
        seg_cols["api_alloc_ts_ns"].append(None)
        for j, blk in enumerate(_list(seg.get("blocks", []), f"{w}.blocks")):
            wb = _where("segments", i, "blocks", j)
            blk = _dict(blk, wb)
            state = _str(blk, "state", wb)
            if state not in _STATES:
                raise SnapshotError(f"{wb}.state is {state!r}, not one of "
                                    f"{', '.join(schema.BLOCK_STATES.values())}")
            code = _STATES[state]
            blk_cols["device"].append(device)
            blk_cols["segment_address"].append(address)
            blk_cols["address"].append(_int(blk, "address", wb))
            blk_cols["size_bytes"].append(_int(blk, "size", wb))
            blk_cols["requested_size_bytes"].append(_int(blk, "requested_size", wb, default=0))
            blk_cols["state_code"].append(code)
            blk_cols["state"].append(schema.BLOCK_STATES[code])
            blk_cols["stack_id"].append(rows.stack_id(_frames(blk, wb)))
    for dev, trace in enumerate(_list(snap["device_traces"], "device_traces")):
        trace = _list(trace, _where("device_traces", dev))
        for seq, e in enumerate(trace):
            w = _where("device_traces", dev, seq)
            e = _dict(e, w)
            action = _str(e, "action", w)
            if action not in _ACTIONS:
                raise SnapshotError(f"{w}.action is {action!r}, not a trace entry action")
            code = _ACTIONS[action]
            oom = action == "oom"
            ev_cols["time_us"].append(_int(e, "time_us", w, hi=I64_MAX // 1000))
            ev_cols["seq"].append(seq)
            ev_cols["device"].append(dev)
            ev_cols["action_code"].append(code)
            ev_cols["action"].append(action)
            ev_cols["address"].append(None if oom else _int(e, "addr", w))
            ev_cols["device_free_bytes"].append(_int(e, "device_free", w) if oom else None)
            ev_cols["size_bytes"].append(_int(e, "size", w, required=False))
            ev_cols["stream"].append(_int(e, "stream", w, lo=-(1 << 63), required=False))
            ev_cols["stack_id"].append(rows.stack_id(_frames(e, w)))
            ev_cols["compile_context"].append(_str(e, "compile_context", w))
            ev_cols["user_metadata"].append(_str(e, "user_metadata", w))
        trace.clear()
    # a stream is a pointer; PyTorch writes it as a signed int64: keep its bits
    ev_cols["stream"] = [None if s is None else s & U64_MAX for s in ev_cols["stream"]]
    if len(ev_cols["time_us"]) >= 1 << 32:
        raise SnapshotError("more than 2^32 trace entries: not a PyTorch snapshot")
    return rows


@dataclass(frozen=True)
class TorchSnapshot:
    """A read snapshot: its rows and facts about its file."""

    rows: AllocatorRows
    name: str
    sha256: str
    bytes: int
    compression: str


def read_snapshot(path: str | os.PathLike[str]) -> TorchSnapshot:
    """Read the snapshot at `path` with the restricted unpickler and check its shape."""
    name = Path(path).name
    loaded: Loaded = load_plain(path)
    snap = check_top(loaded.value, name)
    try:
        rows = snapshot_rows(snap)
    except SnapshotError as e:
        raise SnapshotError(f"{name}: {e}") from None
    return TorchSnapshot(rows, name, loaded.sha256, loaded.bytes, loaded.compression)


def import_record(snap: TorchSnapshot, **more: Any) -> dict[str, Any]:
    """The manifest's `imported` entry for this snapshot."""
    from gputrace.trace.writer import _version

    return {"kind": KIND, "layer": "allocator", "file": snap.name, "sha256": snap.sha256,
            "bytes": snap.bytes, "compression": snap.compression,
            "gputrace_version": _version(), "unix_s": time.time(), **more}


def write_alone(snap: TorchSnapshot, out: str | os.PathLike[str], *, force: bool = False) -> Path:
    """Write the snapshot as a trace of its own: ts_ns are Unix-epoch ns."""
    from gputrace.trace.writer import write_tables

    snap.rows.place(0, None)
    span = snap.rows.time_us_span()
    manifest: dict[str, Any] = {
        "layers": ["allocator"],
        "clock": {"realtime_offset_ns": 0, "source": "unix-epoch"},
        "imported": [import_record(snap, joined=False)],
    }
    if span is not None:
        manifest.update(start_ts_ns=span[0] * 1000, end_ts_ns=span[1] * 1000)
    return write_tables(out, snap.rows.tables(), manifest=manifest, force=force)
