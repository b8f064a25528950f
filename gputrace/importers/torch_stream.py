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
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from gputrace.importers.pickle_stream import Fallback, Sink, StreamReader
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
    opcode_int,
)
from gputrace.importers.torch_rows import (
    _FRAME,
    _SEEN,
    EVENT_CHUNK,
    U64_MAX,
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
        taken = 0
        while True:
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
                return pos, taken
            if pending:  # the items before these entries first, in order
                self._convert(reader, target, pending)
                self._release(reader.memo)
                taken += len(pending)
                pending = []
                if self.error is not None:
                    return pos, taken
            before = target.seq
            whole = self._run(reader, target, shape, entry, buf, pos, m.end())
            taken += target.seq - before
            if not whole:
                return reader.pos, taken
            if entry is shape.slow and "frames" in shape.keys:
                shape.learn(m.group(shape.keys.index("frames") + 1))
            pos = m.end()

    def _run(self, reader: StreamReader, target: _Trace, shape: Shape,
             entry: re.Pattern[bytes], buf: bytes, pos: int, end: int) -> bool:
        """Rows of the entries `entry` matches from pos to end; False if it stopped
        before `end` (reader.pos is then where the entry it stopped at starts)."""
        found = entry.findall(buf, pos, end)
        n = 0
        while n < len(found):
            room = EVENT_CHUNK - len(self.rows.events["seq"])
            part = found[n:n + room]
            done = self._rows(reader.memo, target, shape, part)
            n += done
            if len(self.rows.events["seq"]) >= EVENT_CHUNK:
                self.rows.flush_events()
                check_rows(self.rows)
            if done < len(part):
                for _ in range(n):  # where the entry it stopped at starts
                    pos = entry.match(buf, pos).end()  # type: ignore[union-attr]
                reader.pos = pos
                return False
        return True

    def _rows(self, memo: list[Any], t: _Trace, shape: Shape,
              found: list[tuple[bytes, ...]]) -> int:
        """Rows of the matched entries, in order; how many (it stops at the first one
        the common path would not take)."""
        rows = self.rows
        actions, texts, stacks = self.actions, self.texts, self.stacks
        canon, order, gone = shape.canon, shape.memo_order, self.gone
        mappend = memo.append
        from_bytes, number = int.from_bytes, opcode_int
        ts: list[int] = []
        codes: list[int] = []
        acts: list[str] = []
        addrs: list[int] = []
        sizes: list[int] = []
        streams: list[int] = []
        sids: list[int | None] = []
        ctxs: list[str | None] = []
        metas: list[str | None] = []
        for g in found:
            act, a, s, st, tu, cx, mt, fr = canon(g)
            ca = actions.get(act)
            if ca is None and (ca := self._action(memo, act)) is None:
                break
            addr = from_bytes(a[2:], "little", signed=True) if a[0] == 0x8A else number(a)
            t_us = from_bytes(tu[2:], "little", signed=True) if tu[0] == 0x8A else number(tu)
            size, stream = number(s), number(st)
            if not (0 <= addr <= U64_MAX and 0 <= size <= SIZE_LIMIT
                    and 0 <= t_us <= _FAST_TIME_MAX and -(1 << 63) <= stream <= U64_MAX):
                break
            ctx = texts[cx] if cx in texts else self._text(memo, cx)
            meta = texts[mt] if mt in texts else self._text(memo, mt)
            if ctx not in (None, "N/A", "") or meta not in (None, ""):
                break
            got = stacks.get(fr)
            if got is None and (got := self._stack(memo, fr)) is None:
                break
            mappend(gone)
            for k in order:
                v = (cx, mt, fr)[k - 5]
                if v[:1] == b"\x8c":
                    mappend(texts[v])
                elif v[:1] == b"]":
                    mappend(got[1])
            ts.append(t_us)
            codes.append(ca[0])
            acts.append(ca[1])
            addrs.append(addr)
            sizes.append(size)
            streams.append(stream)
            sids.append(got[0])
            ctxs.append(ctx)
            metas.append(meta)
        n = len(ts)
        if n:
            cols = rows.events
            cols["time_us"].extend(ts)
            cols["seq"].extend(range(t.seq, t.seq + n))
            cols["device"].extend([t.dev] * n)
            cols["action_code"].extend(codes)
            cols["action"].extend(acts)
            cols["address"].extend(addrs)
            cols["device_free_bytes"].extend([None] * n)
            cols["size_bytes"].extend(sizes)
            cols["stream"].extend(streams)
            cols["stack_id"].extend(sids)
            cols["compile_context"].extend(ctxs)
            cols["user_metadata"].extend(metas)
            t.seq += n
            rows.event_count += n
            self.memo_done = len(memo)
        return n

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
        mine = self.rows
        mine.flush_events()
        ids = [None] + [rows.stack_id(k) for k in mine.stacks]
        same = all(i == j for j, i in enumerate(ids) if j)
        lookup = pa.array(ids, pa.int64())
        for chunk in mine.event_chunks:
            if not same:
                i = chunk.schema.get_field_index("stack_id")
                chunk = chunk.set_column(i, "stack_id", pc.take(lookup, chunk.column(i)))
            rows.event_chunks.append(chunk)
        rows.event_count += mine.event_count
        span, more = rows.time_us_span, mine.time_us_span
        if more is not None:
            rows.time_us_span = more if span is None else (min(span[0], more[0]),
                                                           max(span[1], more[1]))
        for note in mine.notes:
            rows.note(note)
        stack_text = sum(len(f[0] or "") + len(f[1] or "") for k in mine.stacks for f in k)
        rows.count_text(mine.text_bytes - stack_text)
        check_rows(rows)
