"""The rows of the allocator tables from an unpickled PyTorch memory snapshot, in every
format PyTorch has written (docs/importers.md lists them and what each lacks):

- PyTorch 2.0: blocks without `address` (derived from the segment's address plus the
  sizes of the blocks before it, as `_memory_viz.py` does) and without `frames` (taken
  from the block's `history`, newest first); trace entries without `time_us`;
- 2.1: blocks with address and frames, trace entries still without `time_us`;
- 2.2 and later: `time_us`, then `compile_context`, `user_metadata`, pools, settings;
- the list of segments alone (`torch.cuda.memory_snapshot()`).

What a format lacks is null in the tables, never zero, and said once in `notes`.

The walk is bounded by the snapshot's own bytes: every dict and list it reads is
consumed (emptied and marked) once read, so a pickle that references one container
from many places (memo references: a few KB standing for 10^9 rows) is refused at the
second reference rather than walked again; frames, which PyTorch shares between
entries on purpose, are converted once and then looked up. Event rows leave the
Python lists for Arrow in chunks as each device's history is walked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from gputrace import schema
from gputrace.errors import GputraceError
from gputrace.trace.reader import SIZE_LIMIT

U64_MAX = (1 << 64) - 1
I64_MAX = (1 << 63) - 1
MAX_ROWS = 30_000_000
"""Most rows of one allocator table: PyTorch keeps at most `max_entries` trace entries
per device (default 10^5; long runs ask for 10^6-10^7), and a row costs about 100 bytes
in Arrow, so 3x10^7 is a few GiB. More is a crafted file."""
MAX_TEXT_BYTES = 2 << 30
"""Most bytes of text (frame names and files, compile contexts, user metadata) in all
rows together. One string may be referenced by many rows (the pickle's memo); real
snapshots with C++ stacks hold a few hundred MB at most (10^4 distinct stacks of 100
frames of 200 bytes)."""
EVENT_CHUNK = 1 << 18
"""Trace entries converted to Arrow at a time (bounds the Python lists held)."""

_ACTIONS = {v: k for k, v in schema.ALLOCATOR_ACTIONS.items()}
_STATES = {v: k for k, v in schema.BLOCK_STATES.items()}
# older PyTorch documentation spells the pending state this way
_STATES["active_awaiting_free"] = _STATES["active_pending_free"]


class SnapshotError(GputraceError):
    """The file is not a PyTorch memory snapshot gputrace can read."""


class _Mark:
    """Key put in a consumed dict, and first item of a consumed list: no pickle of
    plain data can hold it, so a second reference to the container is recognised."""


_SEEN = _Mark()
_FRAME = _Mark()

Frame = tuple[str | None, str | None, int | None]


def _columns(t: schema.Table) -> dict[str, list[Any]]:
    return {c.name: [] for c in t.columns}


def _where(*path: object) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _show(v: int) -> str:
    """An integer as an error names it: a huge one by its size (int-to-str is bounded)."""
    return str(v) if -(10**30) < v < 10**30 else f"an integer of {v.bit_length()} bits"


def text(v: str) -> str:
    """`v` as UTF-8 can hold it: a lone surrogate (valid in a Python str, not in UTF-8)
    is written as its escape, `\\udcff`."""
    if v.isascii():
        return v
    try:
        v.encode()
        return v
    except UnicodeEncodeError:
        return v.encode("utf-8", "backslashreplace").decode()


def _int(d: dict[Any, Any], key: str, where: str, *, lo: int = 0, hi: int = U64_MAX,
         required: bool = True) -> int | None:
    if key not in d:
        if required:
            raise SnapshotError(f"{where} lacks {key!r}")
        return None
    v = d[key]
    if v is None and not required:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise SnapshotError(f"{where}.{key} is {type(v).__name__}, not an integer")
    if not lo <= v <= hi:
        raise SnapshotError(f"{where}.{key} = {_show(v)} is out of range")
    return v


def _size(d: dict[Any, Any], key: str, where: str, required: bool = True) -> int | None:
    """A byte count: refused past SIZE_LIMIT, as the API layer's sizes are."""
    v = _int(d, key, where, required=required)
    if v is not None and v > SIZE_LIMIT:
        raise SnapshotError(f"{where}.{key} = {_show(v)} bytes is more than any GPU holds "
                            f"({SIZE_LIMIT:,})")
    return v


def _str(d: dict[Any, Any], key: str, where: str) -> str | None:
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, str):
        return text(v)
    raise SnapshotError(f"{where}.{key} is {type(v).__name__}, not a string")


def _dict(v: Any, where: str) -> dict[Any, Any]:
    if not isinstance(v, dict):
        raise SnapshotError(f"{where} is {type(v).__name__}, not a dict")
    if _SEEN in v:
        raise SnapshotError(f"refused: {where} is a second reference to a dict already read "
                            "(shared structure multiplies rows; PyTorch never shares it)")
    return v


def _list(v: Any, where: str) -> list[Any]:
    if not isinstance(v, list):
        raise SnapshotError(f"{where} is {type(v).__name__}, not a list")
    if v and v[0] is _SEEN:
        raise SnapshotError(f"refused: {where} is a second reference to a list already read "
                            "(shared structure multiplies rows; PyTorch never shares it)")
    return v


def _consume(c: dict[Any, Any] | list[Any]) -> None:
    """Empty a container once read (its memory goes now) and mark it read."""
    c.clear()
    if isinstance(c, dict):
        c[_SEEN] = True
    else:
        c.append(_SEEN)


@dataclass
class AllocatorRows:
    """The rows of the allocator tables: segments and blocks as Python lists, events as
    Arrow chunks (plus the lists of the chunk being filled), before the snapshot's clock
    is placed (`place` sets ts_ns and pid)."""

    segments: dict[str, list[Any]] = field(
        default_factory=lambda: _columns(schema.ALLOCATOR_SEGMENTS))
    blocks: dict[str, list[Any]] = field(
        default_factory=lambda: _columns(schema.ALLOCATOR_BLOCKS))
    events: dict[str, list[Any]] = field(
        default_factory=lambda: _columns(schema.ALLOCATOR_EVENTS))
    event_chunks: list[pa.Table] = field(default_factory=list)
    stacks: dict[tuple[Frame, ...], int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    """What the snapshot's format lacks, each said once."""
    event_count: int = 0
    frame_rows: int = 0
    text_bytes: int = 0
    time_us_span: tuple[int, int] | None = None

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def stack_id(self, key: tuple[Frame, ...]) -> int | None:
        """The id of this list of frames (one per distinct list, from 1); None when empty."""
        if not key:
            return None
        sid = self.stacks.get(key)
        if sid is None:
            sid = self.stacks[key] = len(self.stacks) + 1
            self.frame_rows += len(key)
            if self.frame_rows > MAX_ROWS:
                raise SnapshotError(f"refused: more than {MAX_ROWS:,} frames in its stacks")
            self.count_text(sum(len(f[0] or "") + len(f[1] or "") for f in key))
        return sid

    def count_text(self, n: int) -> None:
        """Add `n` bytes of text to the rows' total; refused past MAX_TEXT_BYTES."""
        self.text_bytes += n
        if self.text_bytes > MAX_TEXT_BYTES:
            raise SnapshotError(f"refused: more than {MAX_TEXT_BYTES:,} bytes of text "
                                "(frames, contexts, metadata) in its rows")

    def flush_events(self) -> None:
        """Move the events' Python lists into an Arrow chunk (ts_ns and pid unset)."""
        cols = self.events
        n = len(cols["seq"])
        if not n:
            return
        cols["stream"] = [None if s is None else s & U64_MAX for s in cols["stream"]]
        cols["ts_ns"] = [None] * n
        cols["pid"] = [None] * n
        ts = [t for t in cols["time_us"] if t is not None]
        if ts:
            lo, hi = min(ts), max(ts)
            span = self.time_us_span
            self.time_us_span = (lo, hi) if span is None else (min(span[0], lo),
                                                               max(span[1], hi))
        self.event_chunks.append(pa.Table.from_pydict(
            cols, schema=schema.ALLOCATOR_EVENTS.arrow_schema))
        self.events = _columns(schema.ALLOCATOR_EVENTS)

    def take_events(self, other: AllocatorRows) -> None:
        """Move the events of `other` (rows made before these rows' stacks were
        numbered: the stream reader's) after these, their stack ids renumbered as
        these rows number stacks, in the order `other` first used them."""
        import pyarrow.compute as pc

        other.flush_events()
        ids = [None] + [self.stack_id(k) for k in other.stacks]
        lookup = pa.array(ids, pa.int64())
        same = all(i == j for j, i in enumerate(ids) if j)
        for chunk in other.event_chunks:
            if not same:
                i = chunk.schema.get_field_index("stack_id")
                chunk = chunk.set_column(i, "stack_id", pc.take(lookup, chunk.column(i)))
            self.event_chunks.append(chunk)
        other.event_chunks = []
        self.event_count += other.event_count
        span, more = self.time_us_span, other.time_us_span
        if more is not None:
            self.time_us_span = more if span is None else (min(span[0], more[0]),
                                                           max(span[1], more[1]))
        for note in other.notes:
            self.note(note)
        stack_text = sum(len(f[0] or "") + len(f[1] or "") for k in other.stacks for f in k)
        self.count_text(other.text_bytes - stack_text)

    def place(self, offset_ns: int, pid: int | None) -> None:
        """Set events' ts_ns to time_us in ns minus `offset_ns` (the recording's
        realtime offset; 0 for Unix-epoch ns), and every row's pid."""
        import pyarrow.compute as pc

        self.flush_events()
        for i, t in enumerate(self.event_chunks):
            us = t.column("time_us")
            ts = pc.subtract(pc.multiply(us, pa.scalar(1000, pa.int64())),
                             pa.scalar(offset_ns, pa.int64()))
            t = t.set_column(t.schema.get_field_index("ts_ns"), "ts_ns", ts)
            t = t.set_column(t.schema.get_field_index("pid"), "pid",
                             pa.array([pid] * t.num_rows, pa.int32()))
            self.event_chunks[i] = t.cast(schema.ALLOCATOR_EVENTS.arrow_schema)
        for cols in (self.segments, self.blocks):
            cols["pid"] = [pid] * len(cols["device"])

    def tables(self) -> dict[str, pa.Table]:
        """The four tables, typed by the schema."""
        self.flush_events()
        frames = _columns(schema.ALLOCATOR_FRAMES)
        for key, sid in self.stacks.items():
            for depth, (function, filename, line) in enumerate(key):
                for c, v in zip(("stack_id", "depth", "function", "filename", "line"),
                                (sid, depth, function, filename, line), strict=True):
                    frames[c].append(v)
        ev = schema.ALLOCATOR_EVENTS.arrow_schema
        return {
            schema.ALLOCATOR_SEGMENTS.name: pa.Table.from_pydict(
                self.segments, schema=schema.ALLOCATOR_SEGMENTS.arrow_schema),
            schema.ALLOCATOR_BLOCKS.name: pa.Table.from_pydict(
                self.blocks, schema=schema.ALLOCATOR_BLOCKS.arrow_schema),
            schema.ALLOCATOR_EVENTS.name: (pa.concat_tables(self.event_chunks)
                                           if self.event_chunks else ev.empty_table()),
            schema.ALLOCATOR_FRAMES.name: pa.Table.from_pydict(
                frames, schema=schema.ALLOCATOR_FRAMES.arrow_schema),
        }


# ------------------------------------------------------------------ frames


def _frame(f: Any, where: str) -> Frame:
    """One frame dict as (name, filename, line), converted once: PyTorch shares frame
    dicts between the stacks that hold them, so the dict keeps its tuple."""
    if isinstance(f, dict) and _FRAME in f:
        got: Frame = f[_FRAME]
        return got
    if not isinstance(f, dict):
        raise SnapshotError(f"{where} is {type(f).__name__}, not a dict")
    line = _int(f, "line", where, lo=-(1 << 31), hi=(1 << 31) - 1, required=False)
    out = (_str(f, "name", where), _str(f, "filename", where), line)
    f.clear()
    f[_FRAME] = out
    return out


def stack_of(rows: AllocatorRows, frames: Any, where: str) -> int | None:
    """The stack id of a `frames` list, converted once: a list PyTorch shares between
    entries is replaced by [_FRAME, id] after its first reading."""
    if frames is None:
        return None
    if not isinstance(frames, list):
        raise SnapshotError(f"{where} is {type(frames).__name__}, not a list")
    if len(frames) == 4 and frames[0] is _FRAME:
        # converted: its id among these rows, or its frames for other rows (the
        # streaming reader converts trace entries before the segments' rows exist)
        got: int | None = frames[3] if frames[2] is rows else rows.stack_id(frames[1])
        return got
    try:  # frames PyTorch shares were converted when first seen
        key = tuple([f[_FRAME] for f in frames])
    except (KeyError, TypeError, IndexError):
        key = tuple(_frame(f, f"{where}[{i}]") for i, f in enumerate(frames))
    sid = rows.stack_id(key)
    frames[:] = converted(rows, key, sid)
    return sid


def converted(rows: AllocatorRows, key: tuple[Frame, ...], sid: int | None) -> list[Any]:
    """What a frames list becomes once read: its frames and its stack id in `rows`."""
    return [_FRAME, key, rows, sid]


def _pool_id(v: Any, where: str) -> str | None:
    if v is None:
        return None
    if isinstance(v, (list, tuple)) and all(isinstance(x, int) and not isinstance(x, bool)
                                            and abs(x) < 1 << 64 for x in v):
        return ",".join(str(x) for x in v)
    raise SnapshotError(f"{where}.segment_pool_id is not a pair of integers")


# ------------------------------------------------------------------ segments and blocks


def _block(rows: AllocatorRows, blk: dict[Any, Any], wb: str, device: int | None,
           seg_addr: int, offset: int) -> int:
    """Append one block's row; its size (for the next block's derived address)."""
    cols = rows.blocks
    state = _str(blk, "state", wb)
    if state not in _STATES:
        raise SnapshotError(f"{wb}.state is {state!r}, not one of "
                            f"{', '.join(schema.BLOCK_STATES.values())}")
    code = _STATES[state]
    size = _size(blk, "size", wb)
    assert size is not None
    address = _int(blk, "address", wb, required=False)
    if address is None:  # PyTorch 2.0: blocks lie in address order, end to end
        rows.note("blocks without addresses (PyTorch 2.0): derived from the segment's "
                  "address and the sizes of the blocks before each")
        address = seg_addr + offset
        if address > U64_MAX:
            raise SnapshotError(f"{wb}: the blocks overrun the 64-bit address space")
    requested = _size(blk, "requested_size", wb, required=False)
    if "frames" in blk:
        stack = stack_of(rows, blk["frames"], f"{wb}.frames")
    elif "history" in blk:  # PyTorch 2.0: each allocation of the block, newest first
        hist = _list(blk["history"], f"{wb}.history")
        stack = None
        if hist:
            h = _dict(hist[0], f"{wb}.history[0]")
            stack = stack_of(rows, h.get("frames"), f"{wb}.history[0].frames")
            if requested is None and code != _STATES["inactive"]:
                requested = _size(h, "real_size", f"{wb}.history[0]", required=False)
            _consume(h)
        _consume(hist)
    else:
        stack = None
    if requested is None:
        rows.note("blocks without requested sizes: their requested bytes are null")
    cols["device"].append(device)
    cols["segment_address"].append(seg_addr)
    cols["address"].append(address)
    cols["size_bytes"].append(size)
    cols["requested_size_bytes"].append(requested)
    cols["state_code"].append(code)
    cols["state"].append(schema.BLOCK_STATES[code])
    cols["stack_id"].append(stack)
    return size


def segment_rows(rows: AllocatorRows, segments: list[Any]) -> None:
    """The rows of `segments` (a snapshot's, or the list memory_snapshot() returns)."""
    cols = rows.segments
    for i, seg in enumerate(segments):
        w = _where("segments", i)
        seg = _dict(seg, w)
        device = _int(seg, "device", w, hi=(1 << 15) - 1)
        address = _int(seg, "address", w)
        assert address is not None
        pool = _str(seg, "segment_type", w)
        if pool not in ("large", "small"):
            raise SnapshotError(f"{w}.segment_type is {pool!r}, not 'large' or 'small'")
        expandable = seg.get("is_expandable")
        cols["device"].append(device)
        cols["address"].append(address)
        for col, key in (("total_size_bytes", "total_size"),
                         ("allocated_size_bytes", "allocated_size"),
                         ("active_size_bytes", "active_size")):
            cols[col].append(_size(seg, key, w))
        req = _size(seg, "requested_size", w, required=False)
        if req is None:
            rows.note("segments without requested sizes (PyTorch 2.0 and older): null")
        cols["requested_size_bytes"].append(req)
        stream = _int(seg, "stream", w, lo=-(1 << 63), required=False)
        cols["stream"].append(None if stream is None else stream & U64_MAX)
        pool_id = _pool_id(seg.get("segment_pool_id"), w)
        if "segment_pool_id" not in seg:
            rows.note("segments without pool ids (PyTorch 2.1 and older): pool_id is null")
        cols["pool"].append(pool)
        cols["pool_id"].append(pool_id)
        cols["is_expandable"].append(expandable if isinstance(expandable, bool) else None)
        cols["stack_id"].append(stack_of(rows, seg.get("frames"), f"{w}.frames"))
        cols["api_alloc_ts_ns"].append(None)
        offset = 0
        blocks = _list(seg.get("blocks", []), f"{w}.blocks")
        for j, blk in enumerate(blocks):
            wb = _where("segments", i, "blocks", j)
            blk = _dict(blk, wb)
            offset += _block(rows, blk, wb, device, address, offset)
            _consume(blk)
            if len(rows.blocks["address"]) > MAX_ROWS:
                raise SnapshotError(f"refused: more than {MAX_ROWS:,} blocks")
        _consume(blocks)
        _consume(seg)
        if len(cols["address"]) > MAX_ROWS:
            raise SnapshotError(f"refused: more than {MAX_ROWS:,} segments")
