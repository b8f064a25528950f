"""A snapshot's trace entries turned into rows while the pickle is read, never held.

`SnapshotSink` tells pickle_stream's reader that the lists in `device_traces` (each
device's history) are streamed: their items become event rows as each APPENDS batch
is read, and the dicts are dropped (their memo slots point at one consumed stand-in).
The rest of the snapshot (segments, blocks, settings) is built as before and read by
torch_rows once the file is read.

Most entries are read without building them at all: once the reader has seen an
entry's keys stored in its memo, the sink compiles the byte pattern of an entry of
those keys in that order (key references as literal bytes, each value one of the
opcodes a plain value of that field can be: an integer opcode, a reference or an
inline `N/A`, a frames list of memo references), and turns a whole run of matching
entries into rows with one regular-expression pass, checking each value as
torch_entries' common path does. An entry the pattern does not match (a new frame, an
`oom`, a value of another type) is read opcode by opcode and checked field by field
by torch_entries, exactly as the reference reader would: the tables are the same
(tests/unit/importers/test_torch_stream.py compares them on every fixture).

Stack ids: the reference reader numbers the segments' stacks first, then the entries'
in order. The entries come later in the file but are read first here, so their rows
carry provisional ids that `finish` renumbers once the segments are read.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from gputrace.importers import pickle_stream, torch_scan
from gputrace.importers.pickle_stream import Fallback, Sink, StreamReader
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
from gputrace.importers.torch_entries import (
    _FAST_ACTIONS,
    _FAST_TIME_MAX,
    _entry,
    _fast_entry,
    add_row,
    check_rows,
)
from gputrace.importers.torch_patterns import (
    FAST_KEYS,
    INLINE_TEXTS,
    MAX_SHAPES,
    Shape,
    memo_slot,
)
from gputrace.importers.torch_rows import (
    _FRAME,
    _SEEN,
    EVENT_CHUNK,
    AllocatorRows,
    Frame,
    SnapshotError,
    _consume,
    _dict,
    _frame,
    _where,
    converted,
    stack_of,
)
from gputrace.trace.reader import SIZE_LIMIT

_CTX = (None, "N/A", "")
_META = (None, "")


class _Trace(list[Any]):
    """A device's history: stays empty, its entries become rows as they come."""

    dev: int
    seq: int


class SnapshotSink(Sink):
    """Streams `device_traces[i]` of the top-level dict into `self.rows`."""

    watch = FAST_KEYS

    def __init__(self) -> None:
        self.rows = AllocatorRows()
        self.outer: list[Any] | None = None
        self.outer_at = 0
        self.outer_marks = 0
        self.traces: list[_Trace] = []
        self.error: SnapshotError | None = None
        self.shapes: dict[tuple[str, ...], Shape | None] = {}
        self.order: list[Shape] = []
        self.actions: dict[bytes, tuple[int, str]] = {}
        self.texts: dict[bytes, str | None] = dict(INLINE_TEXTS)
        self.stacks: dict[bytes, tuple[int | None, list[Any] | None]] = {b"": (None, None),
                                                                         b"N": (None, None)}
        self.gone: dict[Any, Any] = {_SEEN: True}
        """What every consumed entry's memo slot points at."""
        self.markers: dict[int | None, list[Any]] = {}
        self.strings: dict[str, str] = {}
        self.memo_done = 0
        self.pending: list[pa.Table] = []
        """Tables of runs of entries not yet made one chunk."""
        self.pending_rows = 0
        self.columns: list[dict[str, Any]] = []
        """Runs read by the compiled reader, as numpy columns, not yet a table."""
        self.names = Interned()
        self.texts_of = Interned()

    # ---------------------------------------------------------------- where lists go

    def new_list(self, reader: StreamReader) -> list[Any] | None:
        st, marks = reader.stack, reader.marks
        if self.outer is None:
            # the value of 'device_traces' in the top-level dict: [dict, k, v, ..., key]
            if (len(st) >= 2 and len(st) % 2 == 0 and type(st[0]) is dict
                    and type(st[-1]) is str and st[-1] == "device_traces"
                    and (not marks or marks == [1])):
                self.outer = []
                self.outer_at, self.outer_marks = len(st), len(marks)
                return self.outer
            return None
        p = self.outer_at
        if len(st) > p and st[p] is self.outer and (
                (len(marks) == self.outer_marks and len(st) == p + 1)
                or (len(marks) == self.outer_marks + 1 and marks[-1] == p + 1)):
            dev = len(self.outer) + len(st) - (p + 1)
            if dev >= 1 << 15:
                raise SnapshotError(f"{_where('device_traces', dev)}: more devices than "
                                    "CUDA numbers")
            t = _Trace()
            t.dev, t.seq = dev, 0
            self.traces.append(t)
            return t
        return None

    frozen_keys = (_SEEN, _FRAME)
    frozen_head = _FRAME

    def appended(self, reader: StreamReader, target: list[Any], items: list[Any]) -> None:
        if not isinstance(target, _Trace):
            raise Fallback("APPEND to the list of device traces")
        self._convert(reader, target, items)
        self._release(reader.memo)

    def _convert(self, reader: StreamReader, target: _Trace, items: list[Any]) -> None:
        """Rows of entries read opcode by opcode, checked by torch_entries."""
        self.flush_runs()  # the runs before these entries go first
        rows = self.rows
        for e in items:
            seq = target.seq
            target.seq += 1
            if self.error is not None:
                continue
            try:
                row = _fast_entry(rows, e) if type(e) is dict else None
                if row is not None:
                    self._learn(reader, tuple(e))
                else:
                    w = _where("device_traces", target.dev, seq)
                    row = _entry(rows, _dict(e, w), w)
            except SnapshotError as err:
                if str(err).startswith("refused: "):
                    raise
                self.error = err  # said after the segments' errors, as the reference
                continue
            add_row(rows, target.dev, seq, row)
            _consume(e)

    def _release(self, memo: list[Any]) -> None:
        """Point the memo slots of consumed entries at one stand-in each: a consumed
        dict, the converted frames list of its stack, one copy of each string."""
        for i in range(self.memo_done, len(memo)):
            v = memo[i]
            t = type(v)
            if t is dict:
                if len(v) == 1 and _SEEN in v:
                    memo[i] = self.gone
            elif t is list:
                if len(v) == 4 and v[0] is _FRAME and v[2] is self.rows:
                    memo[i] = self.markers.setdefault(v[3], v)
            elif t is str:
                memo[i] = self.strings.setdefault(v, v)
        self.memo_done = len(memo)

    def _learn(self, reader: StreamReader, keys: tuple[Any, ...]) -> None:
        """Compile the pattern of entries with these keys, once their memo slots are known."""
        if keys in self.shapes or len(self.shapes) >= MAX_SHAPES:
            return
        slots = reader.memo_watch
        if not all(k in slots and slots[k] >= 0 for k in keys) or len(keys) < 5:
            return
        if not {"action", "addr", "size", "stream", "time_us"} <= set(keys):
            return
        shape = Shape(keys, slots)
        self.shapes[keys] = shape
        self.order.append(shape)

    # ---------------------------------------------------------------- runs of entries

    def skip(self, reader: StreamReader, target: list[Any], pos: int,
             pending: list[Any]) -> tuple[int, int]:
        if not isinstance(target, _Trace) or self.error is not None:
            return pos, 0
        if len(self.order) < MAX_SHAPES:  # learn from the first entries already
            for e in pending:
                if type(e) is dict and _SEEN not in e:
                    self._learn(reader, tuple(e))
        if not self.order:
            return pos, 0
        self._release(reader.memo)
        if torch_scan.compiled is not None:
            return self._skip_compiled(reader, target, pos, pending)
        taken = target.seq
        runs: list[tuple[Shape, re.Pattern[bytes], int, int]] = []
        while True:
            if len(reader.buf) - pos < pickle_stream.AHEAD and not reader.eof:
                # the buffer is about to drop what is before pos: read the runs first
                stopped = self._take(reader, target, runs)
                runs = []
                if stopped is not None:
                    return stopped, target.seq - taken
            reader.pos = pos
            reader.ahead()
            buf, pos = reader.buf, reader.pos
            entry = None
            for shape in self.order:
                m = shape.run.match(buf, pos)
                if m is not None:
                    entry = shape.fast
                    break
            else:  # an entry with a FRAME inside, or a new frames list
                for shape in self.order:
                    m = shape.slow.match(buf, pos)
                    if m is not None:
                        entry = shape.slow
                        break
            if entry is None or m is None:
                stopped = self._take(reader, target, runs)
                return (pos if stopped is None else stopped), target.seq - taken
            if pending:  # the items before these entries first, in order
                taken -= self._pending_first(reader, target, pending)
                pending = []
                if self.error is not None:
                    return pos, target.seq - taken
            runs.append((shape, entry, pos, m.end()))
            if entry is shape.slow and "frames" in shape.keys:
                shape.learn(m.group(shape.keys.index("frames") + 1))
            pos = m.end()

    def _pending_first(self, reader: StreamReader, target: _Trace, pending: list[Any]) -> int:
        """Rows of `pending` (the complete items above the MARK, read opcode by opcode
        before a run) first; how many."""
        self._convert(reader, target, pending)
        self._release(reader.memo)
        return len(pending)

    def _skip_compiled(self, reader: StreamReader, target: _Trace, pos: int,
                       pending: list[Any]) -> tuple[int, int]:
        """skip, each run of entries read by the compiled reader (torch_scan)."""
        taken = target.seq
        while True:
            reader.pos = pos
            reader.ahead()
            buf, pos = reader.buf, reader.pos
            for shape in self.order:
                run = torch_scan.scan(buf, pos, shape.spec)
                if run.n:
                    break
            else:
                return pos, target.seq - taken
            if pending:  # the items before these entries first, in order
                taken -= self._pending_first(reader, target, pending)
                pending = []
                if self.error is not None:
                    return pos, target.seq - taken
            done = self._scanned_rows(reader.memo, target, shape, run)
            if done < run.n:
                return int(run.starts[done]), target.seq - taken
            pos = run.stop

    def _scanned_rows(self, memo: list[Any], t: _Trace, shape: Shape,
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
        stops = self.stacks
        for key, first in zip(fr.values, fr.first.tolist(), strict=True):
            if first >= stop:  # numbered in order of first use, up to stop
                break
            if key not in stops and self._stack(memo, key) is None:
                stop = first
                break
        n = stop
        if not n:
            return 0
        stored: list[tuple[Any, list[Any]]] = []
        for k in shape.memo_order:
            col = run.keyed[FAST_KEYS[k]]
            stored.append((col.index[:n], [
                None if first >= n else self.texts[key] if key[:1] == b"\x8c"
                else self.stacks[key][1] if key[:1] == b"]" else None
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
            "stack_id": np.array([-1 if k not in stops or stops[k][0] is None
                                  else stops[k][0] for k in fr.values],
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
        stop = len(col.index)
        for key, first in zip(col.values, col.first.tolist(), strict=True):
            if key not in table:
                resolve(key)
            if key not in table or (allowed is not None and table[key] not in allowed):
                stop = min(stop, first)
        return stop

    def _take(self, reader: StreamReader, target: _Trace,
              runs: list[tuple[Shape, re.Pattern[bytes], int, int]]) -> int | None:
        """Rows of the entries of `runs` (matched in reader.buf), consecutive runs of
        one shape read as one batch; None, or where the entry it stopped at starts."""
        buf = reader.buf
        i = 0
        while i < len(runs):
            shape = runs[i][0]
            j = i
            found: list[tuple[bytes, ...]] = []
            counts = []
            while j < len(runs) and runs[j][0] is shape:
                _, entry, start, end = runs[j]
                got = entry.findall(buf, start, end)
                found.extend(got)
                counts.append(len(got))
                j += 1
            done = self._rows(reader.memo, target, shape, found)
            if done < len(found):
                for k, count in enumerate(counts):  # the run of the entry it stopped at
                    if done < count:
                        _, entry, pos, _ = runs[i + k]
                        for _ in range(done):
                            pos = entry.match(buf, pos).end()  # type: ignore[union-attr]
                        return pos
                    done -= count
            i = j
        return None

    def _rows(self, memo: list[Any], t: _Trace, shape: Shape,
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
            time_us=t_us[:n], seq0=t.seq, device=t.dev,
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

    def _add_table(self, t: _Trace, table: pa.Table, lo: int, hi: int) -> None:
        """The rows of a run (times from lo to hi) after those read before."""
        rows = self.rows
        if rows.events["seq"]:
            rows.flush_events()  # rows read opcode by opcode before these go first
        self._tabled()
        self.pending.append(table)
        self._counted(t, table.num_rows, lo, hi)

    def _counted(self, t: _Trace, n: int, lo: int, hi: int) -> None:
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
        bad = set()
        for key in dict.fromkeys(col):
            if key not in table:
                resolve(key)  # stored in `table` when it names a value
                if key not in table:
                    bad.add(key)
                    continue
            if allowed is not None and table[key] not in allowed:
                bad.add(key)
        if not bad:
            return len(col)
        return next(i for i, k in enumerate(col) if k in bad)

    def _memoize(self, memo: list[Any], shape: Shape, n: int,
                 values: tuple[tuple[bytes, ...], ...]) -> None:
        """The memo slots the first n entries store, in their order: each entry's dict
        (consumed: one stand-in), then its inline strings and new frames lists."""
        stored = [{key: (self.texts[key] if key[:1] == b"\x8c" else self.stacks[key][1]
                         if key[:1] == b"]" else None) for key in dict.fromkeys(col)}
                  for col in (values[k - 5][:n] for k in shape.memo_order)]
        memo_slots(memo, self.gone, n, [values[k - 5][:n] for k in shape.memo_order], stored)
        self.memo_done = len(memo)

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

    # ---------------------------------------------------------------- the end

    def finish(self, rows: AllocatorRows, traces: Any) -> None:
        """Move the streamed rows into `rows` (whose segments are read), their stack
        ids renumbered as the reference reader numbers them."""
        outer = self.outer
        if outer is None or traces is not outer or len(self.traces) != len(outer) \
                or any(t is not u for t, u in zip(outer, self.traces, strict=True)) \
                or [t.dev for t in self.traces] != list(range(len(outer))):
            raise Fallback("device_traces is not the list of histories read")
        if self.error is not None:
            raise self.error
        self.flush_runs()
        rows.take_events(self.rows)
        check_rows(rows)
