"""Names and lines of Python frames: a code object's name, qualified name, file
and line table read from the process while it lives, cached per (pid, code
address); the line of a frame from its last instruction, as the interpreter's
own PyCode_Addr2Line computes it."""

from __future__ import annotations

from dataclasses import dataclass

from gputrace.record.python_stacks.layouts import NONE, Layout
from gputrace.record.python_stacks.process import Memory

MAX_STR = 4096  # characters of a name or file name read
MAX_TABLE = 1 << 20  # bytes of a line table read


@dataclass(frozen=True)
class Code:
    name: str
    filename: str
    firstlineno: int
    linetable: bytes
    bytecode: int  # address of the first instruction (3.11+), else 0


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


def read_code(mem: Memory, lay: Layout, code_type: int, addr: int) -> Code | None:
    """The code object at `addr`, None when it is not one (or is gone)."""
    raw = mem.read(addr, lay.code_size)
    if raw is None or int.from_bytes(raw[8:16], "little") != code_type:
        return None

    def word(off: int) -> int:
        return int.from_bytes(raw[off : off + 8], "little")

    name = read_str(mem, lay, word(lay.co_qualname if lay.co_qualname != NONE else lay.co_name))
    filename = read_str(mem, lay, word(lay.co_filename))
    table_obj = word(lay.co_linetable)
    size = mem.u64(table_obj + 16)
    table = (mem.read(table_obj + 32, size) if size and size <= MAX_TABLE else b"") or b""
    first = int.from_bytes(raw[lay.co_firstlineno : lay.co_firstlineno + 4], "little",
                           signed=True)  # fmt: skip
    if name is None or filename is None:
        return None
    bytecode = addr + lay.co_code_adaptive if lay.co_code_adaptive != NONE else 0
    return Code(name, filename, first, table, bytecode)


def line_of(code: Code, lay: Layout, instr: int) -> int | None:
    """The source line of the instruction a frame last ran (`instr`: its address,
    3.11+, or f_lasti, 3.10); None where the table gives it none."""
    if lay.version == (3, 10):
        instr &= 0xFFFFFFFF  # f_lasti is an int: the probe's word holds f_lineno above it
        lasti = instr - (1 << 32) if instr >= 1 << 31 else instr
        return _line_310(code.linetable, code.firstlineno, max(lasti, 0) * 2)
    unit = (instr - code.bytecode) // 2 if instr >= code.bytecode else 0
    return _line_311(code.linetable, code.firstlineno, unit)


def _line_310(table: bytes, line: int, target: int) -> int | None:
    """3.10's co_linetable: (bytecode bytes, signed line delta) pairs; -128: no line."""
    addr = 0
    current: int | None = line
    for i in range(0, len(table) - 1, 2):
        delta, ldelta = table[i], table[i + 1]
        if ldelta >= 128:
            ldelta -= 256
        end = addr + delta
        if ldelta == -128:
            current = None
        else:
            line += ldelta
            current = line
        if addr <= target < end:
            return current
        addr = end
    return None


def _varint(table: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while pos < len(table):
        b = table[pos]
        pos += 1
        value |= (b & 63) << shift
        shift += 6
        if not b & 64:
            break
    return value, pos


def _line_311(table: bytes, line: int, target: int) -> int | None:
    """3.11+'s location table (Objects/locations.md): entries of (code units, kind)
    with a line delta by kind; kind 15 has no location."""
    pos = addr = 0
    while pos < len(table):
        first = table[pos]
        pos += 1
        kind, length = (first >> 3) & 15, (first & 7) + 1
        delta: int | None = 0
        if kind == 15:
            delta = None
        elif kind in (13, 14):
            v, pos = _varint(table, pos)
            delta = -(v >> 1) if v & 1 else v >> 1
            if kind == 14:  # end line, start and end columns
                for _ in range(3):
                    _v, pos = _varint(table, pos)
        elif kind >= 10:
            delta, pos = kind - 10, pos + 2
        else:
            pos += 1
        if delta is not None:
            line += delta
        if addr <= target < addr + length:
            return line if delta is not None else None
        addr += length
    return None
