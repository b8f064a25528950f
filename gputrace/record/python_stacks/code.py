"""Names and lines of Python frames: a code object's name, qualified name, file
and line table read from the process while it lives, cached per (pid, code
address); the line of a frame from its last instruction, as the interpreter's
own PyCode_Addr2Line computes it.

The line table is bytes of the traced process (hostile input to a root
recorder): it is read up to MAX_TABLE bytes, decoded once per code object in
one linear pass into runs of (first code unit, line), and every frame's line is
then a binary search (docs/security.md, "Python line tables").
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field

from gputrace.record.python_stacks.layouts import NONE, Layout
from gputrace.record.python_stacks.process import Memory

MAX_STR = 4096  # characters of a name or file name read
MAX_TABLE = 1 << 20
"""Bytes of a line table read per code object (a longer one gives no lines).
Real tables reach 0.7 MiB (a generated 165x165 equation-system function in
sympy's benchmarks, CPython 3.11); decoding a MiB once costs ~0.3 s."""
MAX_VARINT = 6
"""Bytes of one varint in a 3.11+ table: CPython writes at most 32-bit values,
6 bits a byte. A longer one ends the table (no lines after it): unbounded, the
decoder's integer would grow with every byte (quadratic time)."""
PROCESS_TABLES = 8 << 20
"""Bytes of line tables decoded per process over its life (~2.5 s of the drain's
time): past it, new code objects get names but no lines, so a process that
forges many large tables cannot stall the drain for more than that."""
NO_LINE = -1  # a run of code units that has no line (kept as a number in the array)


@dataclass(frozen=True)
class Lines:
    """A line table decoded: run i covers code units [starts[i], starts[i+1]) (the
    last run ends at `end`) and has line lines[i] (NO_LINE: none)."""

    starts: array[int] = field(default_factory=lambda: array("q"))
    lines: array[int] = field(default_factory=lambda: array("q"))
    end: int = 0

    def at(self, unit: int) -> int | None:
        """The line of code unit `unit`, None where the table gives none."""
        i = bisect.bisect_right(self.starts, unit) - 1
        if i < 0 or unit >= self.end:
            return None
        line = self.lines[i]
        return None if line == NO_LINE else line


@dataclass(frozen=True)
class Code:
    name: str
    filename: str
    firstlineno: int
    linetable: bytes
    bytecode: int  # address of the first instruction (3.11+), else 0
    lines: Lines = field(default_factory=Lines)  # the table decoded (read_code)


def read_str(mem: Memory, lay: Layout, addr: int) -> str | None:
    """A str object's text (compact strings: every name and file name)."""
    head = mem.read(addr, lay.ascii_size)
    if head is None:
        return None
    length = int.from_bytes(head[16:24], "little")
    state = int.from_bytes(head[32:36], "little")
    kind, compact, ascii_ = (state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1
    if not compact or kind not in (1, 2, 4) or length > MAX_STR:
        return None
    start = addr + (lay.ascii_size if ascii_ else lay.compact_size)
    data = mem.read(start, length * kind) if length else b""
    if data is None:
        return None
    codec = {1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind]
    return data.decode(codec, "replace")


def read_code(mem: Memory, lay: Layout, code_type: int, addr: int,
              table_budget: int = MAX_TABLE) -> Code | None:
    """The code object at `addr`, None when it is not one (or is gone); its line
    table is read when it holds at most min(MAX_TABLE, `table_budget`) bytes."""
    raw = mem.read(addr, lay.code_size)
    if raw is None or int.from_bytes(raw[8:16], "little") != code_type:
        return None

    def word(off: int) -> int:
        return int.from_bytes(raw[off : off + 8], "little")

    name = read_str(mem, lay, word(lay.co_qualname if lay.co_qualname != NONE else lay.co_name))
    filename = read_str(mem, lay, word(lay.co_filename))
    table_obj = word(lay.co_linetable)
    size = mem.u64(table_obj + 16)
    bound = min(MAX_TABLE, table_budget)
    table = (mem.read(table_obj + 32, size) if size and size <= bound else b"") or b""
    first = int.from_bytes(raw[lay.co_firstlineno : lay.co_firstlineno + 4], "little",
                           signed=True)  # fmt: skip
    if name is None or filename is None:
        return None
    bytecode = addr + lay.co_code_adaptive if lay.co_code_adaptive != NONE else 0
    return Code(name, filename, first, table, bytecode, decode_lines(table, first, lay.version))


def decode_lines(table: bytes, first: int, version: tuple[int, int]) -> Lines:
    """The runs of a line table (3.10's or 3.11+'s format), in one pass over at
    most MAX_TABLE bytes; consecutive entries of one line make one run."""
    out = Lines()
    if len(table) > MAX_TABLE:
        return out
    entries = _entries_310(table, first) if version == (3, 10) else _entries_311(table, first)
    unit = 0
    for length, line in entries:
        if length <= 0:
            continue
        if not out.lines or out.lines[-1] != line:
            out.starts.append(unit)
            out.lines.append(line)
        unit += length
    object.__setattr__(out, "end", unit)
    return out


def line_of(code: Code, lay: Layout, instr: int) -> int | None:
    """The source line of the instruction a frame last ran (`instr`: its address,
    3.11+, or f_lasti, 3.10); None where the table gives it none."""
    if lay.version == (3, 10):
        instr &= 0xFFFFFFFF  # f_lasti is an int: the probe's word holds f_lineno above it
        lasti = instr - (1 << 32) if instr >= 1 << 31 else instr
        return code.lines.at(max(lasti, 0))  # 3.10's runs count bytes / 2: code units
    unit = (instr - code.bytecode) // 2 if instr >= code.bytecode else 0
    return code.lines.at(unit)


def _entries_310(table: bytes, line: int) -> Iterator[tuple[int, int]]:
    """3.10's co_linetable: (bytecode bytes, signed line delta) pairs; -128: no
    line. As (code units, line or NO_LINE)."""
    for i in range(0, len(table) - 1, 2):
        delta, ldelta = table[i], table[i + 1]
        if ldelta >= 128:
            ldelta -= 256
        if ldelta == -128:
            current = NO_LINE
        else:
            line += ldelta
            current = line
        yield delta // 2, current


def _varint(table: bytes, pos: int) -> tuple[int, int] | None:
    """(value, next position) of the varint at `pos`; None when it runs past
    MAX_VARINT bytes or the table's end."""
    value = shift = 0
    for k in range(MAX_VARINT):
        if pos + k >= len(table):
            return None
        b = table[pos + k]
        value |= (b & 63) << shift
        shift += 6
        if not b & 64:
            return value, pos + k + 1
    return None


def _entries_311(table: bytes, line: int) -> Iterator[tuple[int, int]]:
    """3.11+'s location table (Objects/locations.md): entries of (code units, kind)
    with a line delta by kind; kind 15 has no location. As (code units, line or
    NO_LINE); a malformed entry ends the table."""
    pos, n = 0, len(table)
    while pos < n:
        first = table[pos]
        pos += 1
        kind, length = (first >> 3) & 15, (first & 7) + 1
        delta: int | None = 0
        if kind == 15:
            delta = None
        elif kind in (13, 14):
            v = _varint(table, pos)
            if v is None:
                break
            delta = -(v[0] >> 1) if v[0] & 1 else v[0] >> 1
            pos = v[1]
            if kind == 14:  # end line, start and end columns
                for _ in range(3):
                    v = _varint(table, pos)
                    if v is None:
                        return
                    pos = v[1]
        elif kind >= 10:
            delta, pos = kind - 10, pos + 2
        else:
            pos += 1
        if delta is not None:
            line += delta
        yield length, (line if delta is not None else NO_LINE)
