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
entries into rows with one regular-expression pass (or, where the compiled reader is
built, reads the run with it: torch_scan), checking each value as torch_entries'
common path does (torch_runs). An entry the pattern does not match (a new frame, an
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

from gputrace.importers import pickle_stream, torch_scan
from gputrace.importers.pickle_stream import Fallback, Sink, StreamReader
from gputrace.importers.torch_entries import (
    _entry,
    _fast_entry,
    add_row,
    check_rows,
)
from gputrace.importers.torch_patterns import (
    FAST_KEYS,
    MAX_SHAPES,
    Shape,
)
from gputrace.importers.torch_rows import (
    _FRAME,
    _SEEN,
    AllocatorRows,
    SnapshotError,
    _consume,
    _dict,
    _where,
)
from gputrace.importers.torch_runs import History, Runs


class SnapshotSink(Runs, Sink):
    """Streams `device_traces[i]` of the top-level dict into `self.rows`."""

    watch = FAST_KEYS

    def __init__(self) -> None:
        super().__init__()
        self.outer: list[Any] | None = None
        self.outer_at = 0
        self.outer_marks = 0
        self.traces: list[History] = []
        self.error: SnapshotError | None = None
        self.shapes: dict[tuple[str, ...], Shape | None] = {}
        self.order: list[Shape] = []
        self.strings: dict[str, str] = {}

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
            t = History()
            t.dev, t.seq = dev, 0
            self.traces.append(t)
            return t
        return None

    frozen_keys = (_SEEN, _FRAME)
    frozen_head = _FRAME

    def appended(self, reader: StreamReader, target: list[Any], items: list[Any]) -> None:
        if not isinstance(target, History):
            raise Fallback("APPEND to the list of device traces")
        self._convert(reader, target, items)
        self._release(reader.memo)

    def _convert(self, reader: StreamReader, target: History, items: list[Any]) -> None:
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
        if not isinstance(target, History) or self.error is not None:
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

    def _pending_first(self, reader: StreamReader, target: History, pending: list[Any]) -> int:
        """Rows of `pending` (the complete items above the MARK, read opcode by opcode
        before a run) first; how many."""
        self._convert(reader, target, pending)
        self._release(reader.memo)
        return len(pending)

    def _skip_compiled(self, reader: StreamReader, target: History, pos: int,
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

    def _take(self, reader: StreamReader, target: History,
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
