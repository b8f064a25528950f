"""Columns of a run of trace entries read by byte pattern (torch_stream): integer
opcodes decoded by numpy, whole columns checked at once, one Arrow table per run.

What a Python loop did per entry (decode five integers, check their ranges, append to
twelve lists) is done here per column: the bytes of one field of every entry of the
run are joined and decoded in a few vector operations.
"""

from __future__ import annotations

from itertools import repeat
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gputrace import schema

_EVENTS = schema.ALLOCATOR_EVENTS.arrow_schema
TYPES = {f.name: f.type for f in _EVENTS}


def decode_ints(col: tuple[bytes, ...] | list[bytes]
                ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The integers the opcodes of `col` push (BININT1, BININT2, BININT, LONG1) as
    int64, and which fit in it (a 9-byte LONG1, 2^63 or more, does not: its entry is
    left to the per-entry path)."""
    n = len(col)
    same = _same_width(col)
    if same is not None:
        return same, np.ones(n, bool)
    lens = np.fromiter(map(len, col), np.int64, n)
    raw = np.frombuffer(b"".join(col), np.uint8)
    starts = np.zeros(n, np.int64)
    np.cumsum(lens[:-1], out=starts[1:])
    op = raw[starts]
    is_long = op == 0x8A
    first = starts + 1 + is_long
    size = lens - 1 - is_long
    fits = size <= 8
    size = np.minimum(size, 8)
    mat = np.zeros((n, 8), np.uint8)
    for k in range(8):
        has = size > k
        if not has.any():
            break
        mat[has, k] = raw[first[has] + k]
    # BININT and LONG1 are signed: a negative one fills its high bytes with ones
    top = mat[np.arange(n), np.maximum(size - 1, 0)]
    negative = (is_long | (op == 0x4A)) & (top >= 0x80)
    if negative.any():
        for k in range(8):
            fill = negative & (size <= k)
            mat[fill, k] = 0xFF
    return mat.view("<i8").reshape(n), fits


def _same_width(col: tuple[bytes, ...] | list[bytes]) -> np.ndarray[Any, Any] | None:
    """decode_ints of a column whose opcodes are all one opcode of one width (an
    allocator's addresses, times and sizes mostly are), in a few vector operations."""
    n = len(col)
    if not n:
        return None
    width = len(col[0])
    joined = b"".join(col)
    op = col[0][0]
    if len(joined) != n * width or op not in (0x4B, 0x4D, 0x4A, 0x8A) or width > 10:
        return None
    m = np.frombuffer(joined, np.uint8).reshape(n, width)
    # every row starts with the same opcode (and LONG1 length): each is `width` long
    if not (m[:, 0] == op).all() or (op == 0x8A and not (m[:, 1] == width - 2).all()):
        return None
    payload = m[:, 2:] if op == 0x8A else m[:, 1:]
    w = payload.shape[1]
    if w > 8 or w == 0:
        return None
    out = np.zeros((n, 8), np.uint8)
    out[:, :w] = payload
    if op in (0x8A, 0x4A) and w < 8:  # signed: a negative one fills its high bytes
        out[payload[:, w - 1] >= 0x80, w:] = 0xFF
    return out.view("<i8").reshape(n)


def by_key(col: tuple[bytes, ...] | list[bytes], value: dict[bytes, Any],
           kind: pa.DataType) -> pa.Array[Any]:
    """The Arrow column of `value[k]` for each k of `col` (a few distinct keys):
    each distinct value converted once, then taken."""
    keys = list(dict.fromkeys(col))
    where = {k: i for i, k in enumerate(keys)}
    index = np.fromiter(map(where.__getitem__, col), np.int32, len(col))
    values: Any = pa.array([value[k] for k in keys], kind)
    taken: pa.Array[Any] = pc.take(values, pa.array(index, pa.int32()))
    return taken


def objects(values: list[Any]) -> np.ndarray[Any, Any]:
    """`values` as a numpy array of those objects (lists stay items, never rows)."""
    out = np.empty(len(values), object)
    for i, v in enumerate(values):
        out[i] = v
    return out


def memo_slots_indexed(memo: list[Any], entry: Any, n: int,
                       cols: list[tuple[np.ndarray[Any, Any], list[Any]]]) -> None:
    """memo_slots of a run read as columns: each column is (the index of each of the n
    entries' value, what each value stores or None)."""
    cols = [(index, stored) for index, stored in cols if any(v is not None for v in stored)]
    if not cols:
        memo.extend([entry] * n)
        return
    out = np.empty((n, 1 + len(cols)), object)
    keep = np.ones((n, 1 + len(cols)), bool)
    out[:, 0] = objects([entry])
    for j, (index, stored) in enumerate(cols, 1):
        out[:, j] = objects(stored)[index]
        keep[:, j] = np.array([v is not None for v in stored], bool)[index]
    memo.extend(out[keep].tolist())


def memo_slots(memo: list[Any], entry: Any, n: int, cols: list[tuple[bytes, ...]],
               stored: list[dict[bytes, Any]]) -> None:
    """Append to `memo` what each of n entries of a run stores, in its order: `entry`
    (its dict), then for each column in `cols` the value `stored` maps its bytes to,
    when that is not None (an inline string or a new frames list stores one slot)."""
    fields = [list(map(m.__getitem__, col)) for col, m in zip(cols, stored, strict=True)
              if any(v is not None for v in m.values())]
    if not fields:
        memo.extend([entry] * n)
        return
    memo.extend(x for tup in zip(repeat(entry, n), *fields, strict=True)
                for x in tup if x is not None)


class Interned:
    """Values (strings, None) numbered in order of first use: a column of many rows
    and few values is kept as numbers, and made strings once, a chunk at a time."""

    def __init__(self) -> None:
        self.ids: dict[Any, int] = {}
        self.values: list[Any] = []

    def id(self, value: Any) -> int:
        got = self.ids.get(value)
        if got is None:
            got = self.ids[value] = len(self.values)
            self.values.append(value)
        return got

    def lut(self, values: list[Any]) -> np.ndarray[Any, Any]:
        """The id of each of `values` (a run's distinct values), as an index table."""
        return np.array([self.id(v) for v in values], np.int32)

    def column(self, ids: np.ndarray[Any, Any], kind: pa.DataType) -> pa.Array[Any]:
        taken: pa.Array[Any] = pc.take(pa.array(self.values, kind), pa.array(ids, pa.int32()))
        return taken


def first_false(ok: np.ndarray[Any, Any]) -> int:
    """Index of the first False in `ok`, or its length."""
    bad = np.flatnonzero(~ok)
    return int(bad[0]) if bad.size else len(ok)


def columns_table(cols: dict[str, np.ndarray[Any, Any]], names: Interned,
                  texts: Interned) -> pa.Table:
    """run_table of runs kept as numpy columns: `action_id`, `ctx_id` and `meta_id`
    number values of `names` and `texts`; `stack_id` -1 is null."""
    f = _EVENTS.field
    stack = cols["stack_id"]
    return run_table(
        time_us=cols["time_us"], seq=cols["seq"], device=cols["device"],
        codes=pa.array(cols["action_code"], f("action_code").type),
        actions=names.column(cols["action_id"], f("action").type),
        address=cols["address"], size=cols["size"], stream=cols["stream"],
        stack_ids=pa.array(stack, f("stack_id").type, mask=stack < 0),
        ctx=texts.column(cols["ctx_id"], f("compile_context").type),
        meta=texts.column(cols["meta_id"], f("user_metadata").type))


def run_table(*, time_us: np.ndarray[Any, Any], seq: np.ndarray[Any, Any],
              device: np.ndarray[Any, Any], codes: pa.Array[Any], actions: pa.Array[Any],
              address: np.ndarray[Any, Any], size: np.ndarray[Any, Any],
              stream: np.ndarray[Any, Any], stack_ids: pa.Array[Any], ctx: pa.Array[Any],
              meta: pa.Array[Any]) -> pa.Table:
    """The allocator_events rows of runs of entries (ts_ns and pid unset, as
    AllocatorRows.flush_events leaves them)."""
    n = len(time_us)
    f = _EVENTS.field
    cols = {
        "ts_ns": pa.nulls(n, f("ts_ns").type),
        "time_us": pa.array(time_us, f("time_us").type),
        "seq": pa.array(seq.astype(np.uint32), f("seq").type),
        "pid": pa.nulls(n, f("pid").type),
        "device": pa.array(device, f("device").type),
        "action_code": codes,
        "action": actions,
        "address": pa.array(address.astype(np.uint64), f("address").type),
        "size_bytes": pa.array(size.astype(np.uint64), f("size_bytes").type),
        "device_free_bytes": pa.nulls(n, f("device_free_bytes").type),
        # as the per-entry path stores it: the stream & (2^64 - 1)
        "stream": pa.array(stream.view(np.uint64), f("stream").type),
        "stack_id": stack_ids,
        "compile_context": ctx,
        "user_metadata": meta,
    }
    return pa.Table.from_pydict({name: cols[name] for name in _EVENTS.names}, schema=_EVENTS)
