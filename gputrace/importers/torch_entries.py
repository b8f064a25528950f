"""The rows of `device_traces`: each device's trace entries, in order, as Arrow chunks
(torch_rows holds the checks, the consumed-container marks and the rows)."""

from __future__ import annotations

from typing import Any

from gputrace.importers import torch_rows
from gputrace.importers.torch_rows import (
    _ACTIONS,
    _FRAME,
    _SEEN,
    EVENT_CHUNK,
    I64_MAX,
    U64_MAX,
    AllocatorRows,
    SnapshotError,
    _consume,
    _dict,
    _int,
    _list,
    _size,
    _str,
    _where,
    stack_of,
)
from gputrace.trace.reader import SIZE_LIMIT


def trace_rows(rows: AllocatorRows, traces: list[Any]) -> None:
    """The rows of `device_traces`, one device at a time, each list consumed."""
    for dev, trace in enumerate(traces):
        wt = _where("device_traces", dev)
        trace = _list(trace, wt)
        if dev >= 1 << 15:
            raise SnapshotError(f"{wt}: more devices than CUDA numbers")
        for seq, e in enumerate(trace):
            row = _fast_entry(rows, e) if type(e) is dict else None
            if row is None:
                w = _where("device_traces", dev, seq)
                row = _entry(rows, _dict(e, w), w)
            add_row(rows, dev, seq, row)
            _consume(e)
            trace[seq] = None  # the entry's memory goes now
        _consume(trace)
    rows.flush_events()
    check_rows(rows)


def check_rows(rows: AllocatorRows) -> None:
    """Refuse more trace entries than the row ceiling."""
    if rows.event_count > torch_rows.MAX_ROWS:
        raise SnapshotError(f"refused: more than {torch_rows.MAX_ROWS:,} trace entries")


def add_row(rows: AllocatorRows, dev: int, seq: int, row: Row) -> None:
    """Append an entry's row (one place, whichever path checked the entry); a full
    chunk goes to Arrow."""
    t, code, action, addr, free, size, stream, stack, ctx, meta = row
    cols = rows.events
    cols["time_us"].append(t)
    cols["seq"].append(seq)
    cols["device"].append(dev)
    cols["action_code"].append(code)
    cols["action"].append(action)
    cols["address"].append(addr)
    cols["device_free_bytes"].append(free)
    cols["size_bytes"].append(size)
    cols["stream"].append(stream)
    cols["stack_id"].append(stack)
    cols["compile_context"].append(ctx)
    cols["user_metadata"].append(meta)
    rows.event_count += 1
    if len(cols["seq"]) >= EVENT_CHUNK:
        rows.flush_events()
        check_rows(rows)


Row = tuple[int | None, int, str, int | None, int | None, int | None, int | None,
            int | None, str | None, str | None]
"""An entry's fields as its row holds them: time_us, action code, action, address,
device_free_bytes, size_bytes, stream, stack_id, compile_context, user_metadata."""

_FAST_ACTIONS = {a: c for a, c in _ACTIONS.items() if a not in ("oom", "snapshot",
                                                                   "user_defined")}
_FAST_TIME_MAX = I64_MAX // 1000


def _fast_entry(rows: AllocatorRows, e: dict[Any, Any]) -> Row | None:
    """The row of the common entry (an allocation or segment action with plain fields,
    a time stamp and no metadata), checked without building its path for error
    messages; None for anything else, which `_entry` checks field by field."""
    if _SEEN in e:
        return None
    action: Any = e.get("action")
    code = _FAST_ACTIONS.get(action) if type(action) is str else None
    addr, size, t, stream = e.get("addr"), e.get("size"), e.get("time_us"), e.get("stream")
    if (code is None or type(addr) is not int or type(size) is not int
            or type(t) is not int or type(stream) is not int
            or not (0 <= addr <= U64_MAX and 0 <= size <= SIZE_LIMIT
                    and 0 <= t <= _FAST_TIME_MAX and -(1 << 63) <= stream <= U64_MAX)
            or e.get("compile_context") not in (None, "N/A", "")
            or e.get("user_metadata") not in (None, "")):
        return None
    frames = e.get("frames")
    if type(frames) is list and len(frames) == 4 and frames[0] is _FRAME and frames[2] is rows:
        stack = frames[3]
    else:
        try:  # the path is built only when a frame is wrong: the slow path says it
            stack = stack_of(rows, frames, "")
        except SnapshotError:
            return None
    return (t, code, action, addr, None, size, stream, stack, e.get("compile_context"),
            e.get("user_metadata"))


def _entry(rows: AllocatorRows, e: dict[Any, Any], w: str) -> Row:
    """The row of any entry, checked field by field (`w`: its path, for errors)."""
    action = _str(e, "action", w)
    if action not in _ACTIONS:
        raise SnapshotError(f"{w}.action is {action!r}, not a trace entry action")
    oom = action == "oom"
    t = _int(e, "time_us", w, hi=I64_MAX // 1000, required=False)
    if t is None:
        rows.note("trace entries without time_us (PyTorch 2.1 and older): their order "
                  "is kept, their times are null")
    addr = None if oom else _int(e, "addr", w, required=action not in (
        "snapshot", "user_defined"))
    free = _int(e, "device_free", w, required=False) if oom else None
    size = _size(e, "size", w, required=False)
    stream = _int(e, "stream", w, lo=-(1 << 63), required=False)
    stack = stack_of(rows, e.get("frames"), f"{w}.frames")
    ctx, meta = _str(e, "compile_context", w), _str(e, "user_metadata", w)
    if ctx or meta:
        rows.count_text(len(ctx or "") + len(meta or ""))
    return (t, _ACTIONS[action], action, addr, free, size, stream, stack, ctx, meta)
