"""Columns of a run of trace entries read by byte pattern (torch_stream): integer
opcodes decoded by numpy, whole columns checked at once, one Arrow table per run.

What a Python loop did per entry (decode five integers, check their ranges, append to
twelve lists) is done here per column: the bytes of one field of every entry of the
run are joined and decoded in a few vector operations.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from gputrace import schema

_EVENTS = schema.ALLOCATOR_EVENTS.arrow_schema


def decode_ints(col: tuple[bytes, ...] | list[bytes]
                ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The integers the opcodes of `col` push (BININT1, BININT2, BININT, LONG1) as
    int64, and which fit in it (a 9-byte LONG1, 2^63 or more, does not: its entry is
    left to the per-entry path)."""
    n = len(col)
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


def first_false(ok: np.ndarray[Any, Any]) -> int:
    """Index of the first False in `ok`, or its length."""
    bad = np.flatnonzero(~ok)
    return int(bad[0]) if bad.size else len(ok)


def run_table(*, time_us: np.ndarray[Any, Any], seq0: int, device: int,
              codes: list[int], actions: list[str], address: np.ndarray[Any, Any],
              size: np.ndarray[Any, Any], stream: np.ndarray[Any, Any],
              stack_ids: list[int | None], ctx: list[str | None],
              meta: list[str | None]) -> pa.Table:
    """The allocator_events rows of a run of entries (ts_ns and pid unset, as
    AllocatorRows.flush_events leaves them)."""
    n = len(time_us)
    f = _EVENTS.field
    cols = {
        "ts_ns": pa.nulls(n, f("ts_ns").type),
        "time_us": pa.array(time_us, f("time_us").type),
        "seq": pa.array(np.arange(seq0, seq0 + n, dtype=np.uint32), f("seq").type),
        "pid": pa.nulls(n, f("pid").type),
        "device": pa.array(np.full(n, device), f("device").type),
        "action_code": pa.array(codes, f("action_code").type),
        "action": pa.array(actions, f("action").type),
        "address": pa.array(address.astype(np.uint64), f("address").type),
        "size_bytes": pa.array(size.astype(np.uint64), f("size_bytes").type),
        "device_free_bytes": pa.nulls(n, f("device_free_bytes").type),
        # as the per-entry path stores it: the stream & (2^64 - 1)
        "stream": pa.array(stream.view(np.uint64), f("stream").type),
        "stack_id": pa.array(stack_ids, f("stack_id").type),
        "compile_context": pa.array(ctx, f("compile_context").type),
        "user_metadata": pa.array(meta, f("user_metadata").type),
    }
    return pa.Table.from_pydict({name: cols[name] for name in _EVENTS.names}, schema=_EVENTS)
