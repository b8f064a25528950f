"""Reading an untrusted pickle opcode by opcode, so that chosen lists are never built.

`PlainUnpickler` (safe_pickle) builds the whole value before anyone can look at it: a
10^7-entry PyTorch history is ~8 GiB of Python dicts. `StreamReader` interprets the
same binary opcodes itself (protocols 2-5) and lets a `Sink` take the items of chosen
lists as they are appended, and skip runs of opcodes it recognises (the regular trace
entries, torch_stream): those lists stay empty, their items become rows at once.

What it refuses is what `PlainUnpickler` refuses (no opcode can reach a callable:
GLOBAL, STACK_GLOBAL and INST name a global and are refused with the same line;
persistent ids too). Beyond that:

- a tuple as a dict key or set member is refused: hashing a tuple nested through memo
  references costs 2^depth (a 121-byte pickle of depth 40 would hash for hours), and a
  snapshot's keys are strings;
- opcodes no snapshot writer uses (protocol 0/1 text opcodes, REDUCE, BUILD, NEWOBJ,
  extension codes, out-of-band buffers) and a memo slot bound twice raise `Fallback`:
  the caller reads the file again with `PlainUnpickler`, whose answer (a value or its
  one-line error) is then the reference.

Memo slots are a list (8 bytes each: 10^7 entries' slots are 80-160 MB); the sink may
overwrite the slots of what it consumed with one shared stand-in.
"""

from __future__ import annotations

import contextlib
import struct
from typing import IO, Any

from gputrace.errors import GputraceError
from gputrace.importers.safe_pickle import MAX_PICKLE_BYTES, PickleRefused

CHUNK = 1 << 20
"""Bytes read from the decompressed stream at a time."""
AHEAD = 1 << 18
"""Bytes kept ahead of the position when a sink may skip a run of opcodes: a run
stops where the buffer ends, so this bounds how often one stops early."""


class Fallback(GputraceError):
    """The pickle uses something this reader leaves to `PlainUnpickler`."""


class Sink:
    """Where chosen lists go. The base takes nothing: the reader builds everything."""

    watch: tuple[str, ...] = ()
    """Strings whose first memo slot the reader notes in `memo_watch`."""

    def new_list(self, reader: StreamReader) -> list[Any] | None:
        """A list standing for the EMPTY_LIST about to be pushed, or None for a plain
        list. The reader's stack tells where it is."""
        return None

    def appended(self, reader: StreamReader, target: list[Any], items: list[Any]) -> None:
        """Items appended to a list `new_list` returned (they are not stored in it)."""

    def skip(self, reader: StreamReader, target: list[Any], pos: int,
             pending: list[Any]) -> tuple[int, int]:
        """Called inside a MARK above a list `new_list` returned, where an item may
        start at reader.buf[pos]: consume the items it recognises from there (first
        taking `pending`, the complete items above the MARK, when it takes any), and
        return (the position it stopped at, how many items it consumed)."""
        return pos, 0

    frozen_keys: tuple[Any, ...] = ()
    """A dict holding one of these keys was consumed: changing it is refused."""
    frozen_head: Any = None
    """A list whose first item is this was consumed: changing it is refused."""


_D = struct.Struct("<d")


class _Skipped:
    """Stands on the stack for items the sink consumed (an APPENDS still to come
    would have taken them): any other opcode that touches it is left to PlainUnpickler."""


SKIPPED = _Skipped()


def _refuse_frozen() -> PickleRefused:
    return PickleRefused("refused: the snapshot changes a trace entry or frame after its "
                         "history read it (no pickler writes that)")


def _refuse_global(module: Any, name: Any) -> PickleRefused:
    return PickleRefused(f"refused: the snapshot names the global {module}.{name}; "
                         "a PyTorch snapshot holds only plain data")


def _key(k: Any) -> Any:
    if type(k) is tuple:
        raise PickleRefused("refused: the snapshot has a tuple as a dict key or set member "
                            "(its hash is exponential in its nesting); a PyTorch snapshot's "
                            "keys are strings")
    return k


class StreamReader:
    """One pickle from `f`, read with `sink` deciding which lists to stream."""

    def __init__(self, f: IO[bytes], sink: Sink | None = None) -> None:
        self.f = f
        self.sink = sink or Sink()
        self.buf = b""
        self.pos = 0
        self.stack: list[Any] = []
        self.marks: list[int] = []
        self.memo: list[Any] = []
        self.streamed: set[int] = set()
        """ids of the lists the sink stands behind"""
        self.memo_watch: dict[str, int] = dict.fromkeys(self.sink.watch, -1)
        """strings the sink asked to know the memo slot of (filled as they are stored)"""
        self.eof = False
        self.skips = 0
        """SKIPPED stand-ins on the stack"""
        self.done_at = -1
        """Position after the last SETITEM(S) that completed an item above a MARK over
        a streamed list (the sink may take it when the next item starts there)."""

    # ---------------------------------------------------------------- bytes

    def need(self, n: int) -> None:
        """At least `n` bytes from self.pos in self.buf, or the pickle is truncated."""
        if n > MAX_PICKLE_BYTES:
            raise EOFError("pickle data was truncated")
        have = len(self.buf) - self.pos
        if have >= n:
            return
        parts = [self.buf[self.pos:]]
        while have < n and not self.eof:
            got = self.f.read(max(CHUNK, n - have))
            if not got:
                self.eof = True
                break
            parts.append(got)
            have += len(got)
        self.buf = b"".join(parts)
        self.pos = 0
        if have < n:
            raise EOFError("pickle data was truncated")

    def ahead(self) -> None:
        """Top the buffer up to AHEAD bytes past the position when the stream has them."""
        if len(self.buf) - self.pos < AHEAD and not self.eof:
            with contextlib.suppress(EOFError):  # the stream ended: what is there is all
                self.need(AHEAD)

    # ---------------------------------------------------------------- memo

    def _put(self, i: int) -> None:
        memo = self.memo
        v = self.stack[-1]
        if v is SKIPPED:
            raise Fallback("MEMOIZE of consumed items")
        if i != len(memo):  # never written so by a pickler: PlainUnpickler judges
            raise Fallback("memo slot out of order")
        memo.append(v)
        if type(v) is str and v in self.memo_watch and self.memo_watch[v] < 0:
            self.memo_watch[v] = i

    def _get(self, i: int) -> Any:
        if i >= len(self.memo):
            raise Fallback("memo slot not found")
        return self.memo[i]

    def _pop_mark(self, appends: bool = False) -> list[Any]:
        k = self.marks.pop()
        items = self.stack[k:]
        del self.stack[k:]
        if self.skips and SKIPPED in items and not appends:
            raise Fallback("consumed items taken by another opcode")
        return items

    def _append(self, target: Any, items: list[Any]) -> None:
        if type(target) is list:
            head = self.sink.frozen_head
            if head is not None and target and target[0] is head:
                raise _refuse_frozen()
            target.extend(items)
        elif isinstance(target, list) and id(target) in self.streamed:
            if self.skips and SKIPPED in items:
                self.skips -= items.count(SKIPPED)
                items = [x for x in items if x is not SKIPPED]
            self.sink.appended(self, target, items)
        else:
            raise Fallback("APPEND to a non-list")

    def _setitems(self, d: Any, items: list[Any]) -> None:
        if type(d) is not dict or len(items) % 2:
            raise Fallback("SETITEMS on a non-dict")
        for k in self.sink.frozen_keys:
            if k in d:
                raise _refuse_frozen()
        for i in range(0, len(items), 2):
            d[_key(items[i])] = items[i + 1]
        marks, stack = self.marks, self.stack
        if self.streamed and marks and 0 < marks[-1] < len(stack) \
                and id(stack[marks[-1] - 1]) in self.streamed \
                and all(type(x) is dict or x is SKIPPED for x in stack[marks[-1]:]):
            self.done_at = self.pos

    def _skip(self, pending_from: int) -> None:
        """Let the sink take items from self.pos (inside the MARK at `pending_from`)."""
        stack = self.stack
        self.ahead()
        pending = stack[pending_from:]
        pos, n = self.sink.skip(self, stack[pending_from - 1], self.pos,
                                [x for x in pending if x is not SKIPPED])
        self.pos = pos
        if n:
            self.skips -= pending.count(SKIPPED) - 1
            stack[pending_from:] = [SKIPPED]

    # ---------------------------------------------------------------- opcodes

    def load(self) -> Any:
        """The value of the pickle (its streamed lists left empty)."""
        try:
            return self._load()
        except IndexError:  # a stack underflow: PlainUnpickler words it
            raise Fallback("stack underflow") from None

    def _load(self) -> Any:
        stack, marks = self.stack, self.marks
        push = stack.append
        while True:
            if self.pos >= len(self.buf):
                self.need(1)
            buf, pos = self.buf, self.pos
            op = buf[pos]
            self.pos = pos + 1
            if op == 0x68:  # BINGET
                self.need(1)
                push(self._get(self.buf[self.pos]))
                self.pos += 1
            elif op == 0x94:  # MEMOIZE
                self._put(len(self.memo))
            elif op == 0x8C:  # SHORT_BINUNICODE
                self.need(1)
                n = self.buf[self.pos]
                self.pos += 1
                self.need(n)
                push(str(self.buf[self.pos:self.pos + n], "utf-8", "surrogatepass"))
                self.pos += n
            elif op == 0x6A:  # LONG_BINGET
                self.need(4)
                push(self._get(int.from_bytes(self.buf[self.pos:self.pos + 4], "little")))
                self.pos += 4
            elif op == 0x28:  # MARK
                marks.append(len(stack))
                if stack and id(stack[-1]) in self.streamed:
                    self._skip(len(stack))
            elif op == 0x4B:  # BININT1
                self.need(1)
                push(self.buf[self.pos])
                self.pos += 1
            elif op == 0x4A:  # BININT
                self.need(4)
                push(int.from_bytes(self.buf[self.pos:self.pos + 4], "little", signed=True))
                self.pos += 4
            elif op == 0x8A:  # LONG1
                self.need(1)
                n = self.buf[self.pos]
                self.need(1 + n)
                push(int.from_bytes(self.buf[self.pos + 1:self.pos + 1 + n], "little",
                                    signed=True))
                self.pos += 1 + n
            elif op == 0x4D:  # BININT2
                self.need(2)
                push(int.from_bytes(self.buf[self.pos:self.pos + 2], "little"))
                self.pos += 2
            elif op == 0x75:  # SETITEMS
                items = self._pop_mark()
                self._setitems(stack[-1], items)
            elif op == 0x7D:  # EMPTY_DICT
                if pos == self.done_at:  # an item just completed above a streamed list
                    self.pos = pos
                    self._skip(marks[-1])
                    if self.pos != pos:
                        continue
                    self.pos = pos + 1
                push({})
            elif op == 0x5D:  # EMPTY_LIST
                lst = self.sink.new_list(self)
                if lst is None:
                    push([])
                else:
                    self.streamed.add(id(lst))
                    push(lst)
            elif op == 0x65:  # APPENDS
                items = self._pop_mark(appends=True)
                self._append(stack[-1], items)
            elif op == 0x61:  # APPEND
                if len(stack) < 2:
                    raise Fallback("APPEND without a list")
                v = stack.pop()
                if v is SKIPPED:
                    raise Fallback("APPEND of consumed items")
                self._append(stack[-1], [v])
            elif op == 0x73:  # SETITEM
                if len(stack) < 3 or SKIPPED in (stack[-1], stack[-2]):
                    raise Fallback("SETITEM on a non-dict")
                v = stack.pop()
                k = stack.pop()
                self._setitems(stack[-1], [k, v])
            elif op == 0x4E:  # NONE
                push(None)
            elif op == 0x88:  # NEWTRUE
                push(True)
            elif op == 0x89:  # NEWFALSE
                push(False)
            elif op == 0x95:  # FRAME: a length hint; the opcodes run on regardless
                self.need(8)
                self.pos += 8
            elif op == 0x71:  # BINPUT
                self.need(1)
                i = self.buf[self.pos]
                self.pos += 1
                self._put(i)
            elif op == 0x72:  # LONG_BINPUT
                self.need(4)
                i = int.from_bytes(self.buf[self.pos:self.pos + 4], "little")
                self.pos += 4
                self._put(i)
            elif op == 0x29:  # EMPTY_TUPLE
                push(())
            elif op == 0x85:  # TUPLE1
                self._unskipped(1)
                stack[-1] = (stack[-1],)
            elif op == 0x86:  # TUPLE2
                self._unskipped(2)
                b = stack.pop()
                stack[-1] = (stack[-1], b)
            elif op == 0x87:  # TUPLE3
                self._unskipped(3)
                c = stack.pop()
                b = stack.pop()
                stack[-1] = (stack[-1], b, c)
            elif op == 0x74:  # TUPLE
                push(tuple(self._pop_mark()))
            elif op == 0x6C:  # LIST
                push(self._pop_mark())
            elif op == 0x64:  # DICT
                items = self._pop_mark()
                if len(items) % 2:
                    raise Fallback("odd DICT")
                push({_key(items[i]): items[i + 1] for i in range(0, len(items), 2)})
            elif op == 0x8F:  # EMPTY_SET
                push(set())
            elif op == 0x90:  # ADDITEMS
                items = self._pop_mark()
                if not stack or type(stack[-1]) is not set:
                    raise Fallback("ADDITEMS on a non-set")
                stack[-1].update(_key(x) for x in items)
            elif op == 0x91:  # FROZENSET
                push(frozenset(_key(x) for x in self._pop_mark()))
            elif op == 0x58 or op == 0x8D:  # BINUNICODE, BINUNICODE8
                w = 4 if op == 0x58 else 8
                self.need(w)
                n = int.from_bytes(self.buf[self.pos:self.pos + w], "little")
                self.pos += w
                self.need(n)
                push(str(self.buf[self.pos:self.pos + n], "utf-8", "surrogatepass"))
                self.pos += n
            elif op in (0x43, 0x42, 0x8E, 0x96):  # SHORT_BINBYTES, BINBYTES(8), BYTEARRAY8
                w = {0x43: 1, 0x42: 4, 0x8E: 8, 0x96: 8}[op]
                self.need(w)
                n = int.from_bytes(self.buf[self.pos:self.pos + w], "little")
                self.pos += w
                self.need(n)
                data = self.buf[self.pos:self.pos + n]
                push(bytearray(data) if op == 0x96 else data)
                self.pos += n
            elif op == 0x47:  # BINFLOAT
                self.need(8)
                push(struct.unpack(">d", self.buf[self.pos:self.pos + 8])[0])
                self.pos += 8
            elif op == 0x8B:  # LONG4
                self.need(4)
                n = int.from_bytes(self.buf[self.pos:self.pos + 4], "little", signed=True)
                if n < 0:
                    raise Fallback("negative LONG4")
                self.need(4 + n)
                push(int.from_bytes(self.buf[self.pos + 4:self.pos + 4 + n], "little",
                                    signed=True))
                self.pos += 4 + n
            elif op == 0x30:  # POP
                if stack and (not marks or marks[-1] < len(stack)):
                    self._unskipped(1)
                    stack.pop()
                elif marks:
                    marks.pop()
                else:
                    raise Fallback("POP of an empty stack")
            elif op == 0x31:  # POP_MARK
                self._pop_mark()
            elif op == 0x32:  # DUP
                self._unskipped(1)
                push(stack[-1])
            elif op == 0x80:  # PROTO
                self.need(1)
                self.pos += 1
            elif op == 0x2E:  # STOP
                if len(stack) != 1 or marks or stack[0] is SKIPPED:
                    raise Fallback("STOP with a stack of other than one value")
                return stack.pop()
            elif op == 0x63 or op == 0x69:  # GLOBAL, INST: module and name on lines
                names = []
                for _ in range(2):
                    line = self._line()
                    names.append(line.decode("utf-8", "backslashreplace"))
                raise _refuse_global(*names)
            elif op == 0x93:  # STACK_GLOBAL
                if len(stack) < 2 or type(stack[-1]) is not str or type(stack[-2]) is not str:
                    raise Fallback("STACK_GLOBAL of non-strings")
                raise _refuse_global(stack[-2], stack[-1])
            elif op == 0x50 or op == 0x51:  # PERSID, BINPERSID
                raise PickleRefused("refused: the snapshot holds a persistent reference; "
                                    "a PyTorch snapshot holds only plain data")
            else:  # text opcodes, REDUCE, BUILD, NEWOBJ, EXT*, buffers, unknown
                raise Fallback(f"opcode {op:#x}")

    def _unskipped(self, n: int) -> None:
        if self.skips and SKIPPED in self.stack[-n:]:
            raise Fallback("consumed items taken by another opcode")

    def _line(self) -> bytes:
        """Bytes up to the next newline (GLOBAL's operands), bounded."""
        for _ in range(64):
            end = self.buf.find(b"\n", self.pos)
            if end >= 0:
                line = self.buf[self.pos:end]
                self.pos = end + 1
                return line
            self.need(len(self.buf) - self.pos + 1)
        raise Fallback("long GLOBAL line")
