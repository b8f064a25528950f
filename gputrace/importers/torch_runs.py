"""Runs of regular trace entries turned into event rows (torch_stream's sink).

A run is read either by the byte patterns (torch_patterns: a tuple of raw opcode
bytes per entry, `_rows`) or by the compiled reader (torch_scan: numpy columns, the
keyed fields as indices into their distinct raw values, `_scanned_rows`). Both check
each value as torch_entries' common path would, column by column: the memo slot an
action or a text refers to names an allowed value, integers are in range, a frames
list resolves to frames; a run stops at the first entry that fails (the per-entry
path reads it). What the references name is resolved once per distinct raw value and
kept (`actions`, `texts`, `stacks`); stack ids are numbered in order of first use.
Rows wait as tables (patterns) or columns (compiled) until a chunk of EVENT_CHUNK.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from gputrace.importers import torch_scan
from gputrace.importers.torch_columns import (
    TYPES,
    Interned,
    by_key,
    columns_table,
    decode_ints,
    first_false,
    memo_slots,
    memo_slots_indexed,
    run_table,
)
from gputrace.importers.torch_entries import _FAST_ACTIONS, _FAST_TIME_MAX, check_rows
from gputrace.importers.torch_patterns import FAST_KEYS, INLINE_TEXTS, Shape, memo_slot
from gputrace.importers.torch_rows import (
    _FRAME,
    _SEEN,
    EVENT_CHUNK,
    AllocatorRows,
    Frame,
    SnapshotError,
    _frame,
    converted,
    stack_of,
)
from gputrace.trace.reader import SIZE_LIMIT

_CTX = (None, "N/A", "")
_META = (None, "")


class History(list[Any]):
    """A device's history: stays empty, its entries become rows as they come."""

    dev: int
    seq: int


class Runs:
    """What runs of entries become: the rows, and what the references they hold name."""

    def __init__(self) -> None:
        self.rows = AllocatorRows()
        self.actions: dict[bytes, tuple[int, str]] = {}
        self.texts: dict[bytes, str | None] = dict(INLINE_TEXTS)
        self.stacks: dict[bytes, tuple[int | None, list[Any] | None]] = {b"": (None, None),
                                                                         b"N": (None, None)}
        self.gone: dict[Any, Any] = {_SEEN: True}
        """What every consumed entry's memo slot points at."""
        self.markers: dict[int | None, list[Any]] = {}
        self.memo_done = 0
        self.pending: list[pa.Table] = []
        """Tables of runs of entries not yet made one chunk."""
        self.pending_rows = 0
        self.columns: list[dict[str, Any]] = []
        """Runs read by the compiled reader, as numpy columns, not yet a table."""
        self.names = Interned()
        self.texts_of = Interned()

    def _scanned_rows(self, memo: list[Any], t: History, shape: Shape,
                      run: torch_scan.Run) -> int:
        """_rows of a run read by the compiled reader: the same checks and rows, each
        distinct value of a keyed field named once."""
        act, cx, mt, fr = (run.keyed[k] for k in torch_scan.KEYED)
        stop = min(self._known_first(self.actions, act, lambda r: self._action(memo, r)),
                   self._known_first(self.texts, cx, lambda r: self._text(memo, r), _CTX),
                   self._known_first(self.texts, mt, lambda r: self._text(memo, r), _META))
        addr, size, t_us = run.addr, run.size, run.time_us
        stop = min(stop, first_false((addr >= 0) & (size >= 0) & (size <= SIZE_LIMIT)
                                     & (t_us >= 0) & (t_us <= _FAST_TIME_MAX)))
        sids: dict[bytes, int | None] = {}
        for key, first in zip(fr.values, fr.first.tolist(), strict=True):
            if first >= stop:  # numbered in order of first use, up to stop
                break
            got = self.stacks.get(key) or self._stack(memo, key)
            if got is None:
                stop = first
                break
            sids[key] = got[0]
        n = stop
        if not n:
            return 0
        stored: list[tuple[Any, list[Any]]] = []
        for k in shape.memo_order:
            col = run.keyed[FAST_KEYS[k]]
            stored.append((col.index[:n], [
                None if first >= n else self._stored(key)
                for key, first in zip(col.values, col.first.tolist(), strict=True)]))
        memo_slots_indexed(memo, self.gone, n, stored)
        self.memo_done = len(memo)
        t_us = t_us[:n]
        action = [self.actions.get(k, (0, None)) for k in act.values]
        cols = {
            "time_us": t_us, "seq": np.arange(t.seq, t.seq + n, dtype=np.int64),
            "device": np.full(n, t.dev, np.int16),
            "action_code": np.array([a[0] for a in action], np.uint8)[act.index[:n]],
            "action_id": self.names.lut([a[1] for a in action])[act.index[:n]],
            "address": addr[:n], "size": size[:n], "stream": run.stream[:n],
            "stack_id": np.array([-1 if sids.get(k) is None else sids[k] for k in fr.values],
                                 np.int64)[fr.index[:n]],
            "ctx_id": self.texts_of.lut([self.texts.get(k) for k in cx.values])[cx.index[:n]],
            "meta_id": self.texts_of.lut([self.texts.get(k) for k in mt.values])[mt.index[:n]],
        }
        rows = self.rows
        if rows.events["seq"]:
            rows.flush_events()  # rows read opcode by opcode before these go first
        self.columns.append(cols)
        self._counted(t, n, int(t_us.min()), int(t_us.max()))
        return n

    def _known_first(self, table: dict[bytes, Any], col: torch_scan.Keyed,
                     resolve: Callable[[bytes], Any],
                     allowed: tuple[Any, ...] | None = None) -> int:
        """_known of a keyed column: the first entry whose value cannot be named."""
        bad = self._unnamed(table, col.values, resolve, allowed)
        first = col.first.tolist()
        return min((first[i] for i, key in enumerate(col.values) if key in bad),
                   default=len(col.index))

    def _rows(self, memo: list[Any], t: History, shape: Shape,
              found: list[tuple[bytes, ...]]) -> int:
        """Rows of the matched entries, in order, checked column by column; how many
        (it stops at the first one the common path would not take)."""
        n = len(found)
        act, a, s, st, tu, cx, mt, fr = shape.canon(list(zip(*found, strict=True)))
        # each check may stop the run early: the entries before the first failing one
        stop = min(self._known(self.actions, act, lambda r: self._action(memo, r)),
                   self._known(self.texts, cx, lambda r: self._text(memo, r), _CTX),
                   self._known(self.texts, mt, lambda r: self._text(memo, r), _META))
        (addr, f1), (size, f2), (stream, f3), (t_us, f4) = (decode_ints(c) for c in (a, s, st, tu))
        stop = min(stop, first_false(f1 & f2 & f3 & f4 & (addr >= 0) & (size >= 0)
                                     & (size <= SIZE_LIMIT) & (t_us >= 0)
                                     & (t_us <= _FAST_TIME_MAX)))
        # stacks are numbered in order of first use: resolved in that order, up to stop
        stops = self.stacks
        for key in dict.fromkeys(fr[:stop]):
            if key not in stops and self._stack(memo, key) is None:
                stop = fr.index(key)
                break
        n = stop
        if not n:
            return 0
        self._memoize(memo, shape, n, (cx, mt, fr))
        act, fr = act[:n], fr[:n]
        table = run_table(
            time_us=t_us[:n], seq=np.arange(t.seq, t.seq + n), device=np.full(n, t.dev),
            codes=by_key(act, {k: v[0] for k, v in self.actions.items()},
                         TYPES["action_code"]),
            actions=by_key(act, {k: v[1] for k, v in self.actions.items()}, TYPES["action"]),
            address=addr[:n], size=size[:n], stream=stream[:n],
            stack_ids=by_key(fr, {k: stops[k][0] for k in dict.fromkeys(fr)},
                             TYPES["stack_id"]),
            ctx=by_key(cx[:n], self.texts, TYPES["compile_context"]),
            meta=by_key(mt[:n], self.texts, TYPES["user_metadata"]))
        self._add_table(t, table, int(t_us[:n].min()), int(t_us[:n].max()))
        return n

    def _add_table(self, t: History, table: pa.Table, lo: int, hi: int) -> None:
        """The rows of a run (times from lo to hi) after those read before."""
        rows = self.rows
        if rows.events["seq"]:
            rows.flush_events()  # rows read opcode by opcode before these go first
        self._tabled()
        self.pending.append(table)
        self._counted(t, table.num_rows, lo, hi)

    def _counted(self, t: History, n: int, lo: int, hi: int) -> None:
        """n rows of `t` (times from lo to hi) pending."""
        rows = self.rows
        self.pending_rows += n
        span = rows.time_us_span
        rows.time_us_span = (lo, hi) if span is None else (min(span[0], lo), max(span[1], hi))
        t.seq += n
        rows.event_count += n
        if self.pending_rows >= EVENT_CHUNK:
            self.flush_runs()
        check_rows(rows)

    def _tabled(self) -> None:
        """The runs kept as columns, as one table after the pending ones."""
        if self.columns:
            cols = {k: np.concatenate([c[k] for c in self.columns]) for k in self.columns[0]}
            self.columns = []
            self.pending.append(columns_table(cols, self.names, self.texts_of))

    def flush_runs(self) -> None:
        """The runs' tables read so far, as one chunk of the events."""
        self._tabled()
        if self.pending:
            self.rows.event_chunks.append(pa.concat_tables(self.pending).combine_chunks())
            self.pending, self.pending_rows = [], 0

    def _known(self, table: dict[bytes, Any], col: tuple[bytes, ...],
               resolve: Callable[[bytes], Any], allowed: tuple[Any, ...] | None = None) -> int:
        """Index of the first value of `col` that `resolve` cannot name (or names as
        something not `allowed`); its length when there is none."""
        bad = self._unnamed(table, dict.fromkeys(col), resolve, allowed)
        if not bad:
            return len(col)
        return next(i for i, k in enumerate(col) if k in bad)

    def _unnamed(self, table: dict[bytes, Any], keys: Iterable[bytes],
                 resolve: Callable[[bytes], Any], allowed: tuple[Any, ...] | None) -> set[bytes]:
        """Which of these distinct raw values `resolve` cannot name (it stores a value
        it names in `table`), or names as something not `allowed`."""
        bad = set()
        for key in keys:
            if key not in table:
                resolve(key)
                if key not in table:
                    bad.add(key)
                    continue
            if allowed is not None and table[key] not in allowed:
                bad.add(key)
        return bad

    def _memoize(self, memo: list[Any], shape: Shape, n: int,
                 values: tuple[tuple[bytes, ...], ...]) -> None:
        """The memo slots the first n entries store, in their order: each entry's dict
        (consumed: one stand-in), then its inline strings and new frames lists."""
        stored = [{key: self._stored(key) for key in dict.fromkeys(col)}
                  for col in (values[k - 5][:n] for k in shape.memo_order)]
        memo_slots(memo, self.gone, n, [values[k - 5][:n] for k in shape.memo_order], stored)
        self.memo_done = len(memo)

    def _stored(self, key: bytes) -> Any:
        """What a value's raw bytes store in the memo: an inline string its text, a new
        frames list its converted list; a reference or None nothing (None)."""
        if key[:1] == b"\x8c":
            return self.texts[key]
        return self.stacks[key][1] if key[:1] == b"]" else None

    def _action(self, memo: list[Any], ref: bytes) -> tuple[int, str] | None:
        i = memo_slot(ref)
        v = memo[i] if i < len(memo) else None
        if type(v) is not str or v not in _FAST_ACTIONS:
            return None
        self.actions[ref] = got = (_FAST_ACTIONS[v], v)
        return got

    def _text(self, memo: list[Any], ref: bytes) -> Any:
        """The string a reference names, or an inline one with a FRAME inside (a mark
        object, never a row's text, if none)."""
        if ref[:1] == b"\x8c":
            text = self.texts[ref] = ref[2:2 + ref[1]].decode()
            return text
        i = memo_slot(ref)
        v = memo[i] if i < len(memo) else _SEEN
        if v is None or type(v) is str:
            self.texts[ref] = v
            return v
        return _SEEN

    def _stack(self, memo: list[Any], fr: bytes) -> tuple[int | None, list[Any] | None] | None:
        """(stack id, the converted list to store in the memo or None) of a frames
        value: a reference to a list, or a new list of references to frame dicts."""
        rows = self.rows
        if fr[0] != 0x5D:  # a reference to a list read before
            i = memo_slot(fr)
            v = memo[i] if i < len(memo) else None
            if type(v) is not list:
                return None
            try:
                sid = stack_of(rows, v, "")
            except SnapshotError:
                return None
            if len(v) == 4 and v[0] is _FRAME and v[2] is rows:
                self.stacks[fr] = (sid, None)
            return (sid, None)
        key: list[Frame] = []
        pos = 0
        while pos < len(fr):  # the pattern matched: refs, FRAMEs and list opcodes
            c = fr[pos]
            if c == 0x95:
                pos += 9
                continue
            if c != 0x68 and c != 0x6A:
                pos += 1
                continue
            n = 2 if c == 0x68 else 5
            i = memo_slot(fr[pos:pos + n])
            pos += n
            f = memo[i] if i < len(memo) else None
            try:
                key.append(_frame(f, ""))
            except SnapshotError:
                return None
        k = tuple(key)
        sid = rows.stack_id(k)
        got = (sid, self.markers.setdefault(sid, converted(rows, k, sid)))
        self.stacks[fr] = got
        return got
