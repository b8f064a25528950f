"""Is a traced process a CPython, and where does the probe find its threads?

Read from /proc/PID/maps, the interpreter's ELF symbols (`_PyRuntime`,
`PyCode_Type`, `Py_Version`) and the process's memory (/proc/PID/mem). A
process whose interpreter cannot be placed with certainty gets no `py_proc`
entry (native frames only) and one line saying why: wrong frames are worse than
none.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat as statmod
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from gputrace.record import elf
from gputrace.record.python_stacks import layouts
from gputrace.record.python_stacks.layouts import Layout, LayoutError

INTERPRETER_NAME = re.compile(r"^(lib)?python(\d+)\.(\d+)[a-z]*(\.so[\w.]*)?$")
"""A CPython interpreter's file name: the executable or libpython (the unwinder
gives it the first table slot: gputrace/record/unwind/tables.py)."""
_WANT = (b"_PyRuntime", b"PyCode_Type", b"Py_Version")
SHT_SYMTAB, SHT_DYNSYM = 2, 11
PT_LOAD = 1
ET_EXEC = 2
GLIBC_TID_SPAN = 2048  # bytes of glibc's struct pthread searched for the tid field
MAX_INTERPRETER_BYTES = 256 << 20
"""The largest interpreter file read (whole, as root): a CPython executable or libpython
is 5-30 MB (a debug build with symbols under 100 MB). A traced process may map any file
under an interpreter's name: a sparse 8 GiB one was read whole into the recorder."""
MAX_NAME_HITS = 64
"""Places one wanted name is looked for in a string table (an honest one holds it once)."""
SYM_SIZE = 24  # Elf64_Sym: st_name u32 @0, st_shndx u16 @6, st_value u64 @8


class Memory:
    """Reads of one process's memory (/proc/PID/mem); None where unmapped or gone."""

    def __init__(self, pid: int) -> None:
        self.fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)

    def read(self, addr: int, size: int) -> bytes | None:
        if addr <= 0 or size <= 0:
            return None
        try:
            data = os.pread(self.fd, size, addr)
        except OSError:
            return None
        return data if len(data) == size else None

    def u64(self, addr: int) -> int | None:
        b = self.read(addr, 8)
        return None if b is None else int.from_bytes(b, "little")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


@dataclass
class PyProcess:
    """A CPython process the probe can walk."""

    pid: int
    path: str
    layout: Layout
    runtime: int  # address of _PyRuntime
    code_type: int  # address of PyCode_Type: a frame's code object must be one
    pthread_tid: int  # 0, or where glibc's struct pthread holds the tid (3.10)
    mem: Memory


def elf_objects(path: str) -> tuple[int, list[tuple[int, int]], dict[bytes, int]]:
    """(e_type, PT_LOAD (offset, vaddr) pairs, {name: vaddr}) of the symbols in _WANT.

    The file is whatever a traced process maps under an interpreter's name, read as
    root, so the read is bounded whatever it holds (docs/security.md, "Files a traced
    process chooses"): opened without following a link or blocking (a FIFO is not
    waited on), a regular file of at most MAX_INTERPRETER_BYTES, at most
    elf.MAX_SYMBOLS entries, and each wanted name found in the string tables (its
    offsets) then matched against the entries at once: no name is sliced to its NUL.
    ValueError (or OSError) says why a file is not one."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not statmod.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_size > MAX_INTERPRETER_BYTES:
            raise ValueError(f"file of {st.st_size} bytes, over the "
                             f"{MAX_INTERPRETER_BYTES >> 20} MiB bound")
        with os.fdopen(os.dup(fd), "rb") as f:
            d = f.read(st.st_size)  # its size then: grown since, the rest is not read
    finally:
        os.close(fd)
    if d[:4] != b"\x7fELF" or d[4] != 2 or d[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    (e_type,) = struct.unpack_from("<H", d, 16)
    phoff, shoff = struct.unpack_from("<QQ", d, 32)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", d, 54)
    loads = []
    for i in range(phnum):
        p_type, _f, p_offset, p_vaddr = struct.unpack_from("<IIQQ", d, phoff + i * phentsize)
        if p_type == PT_LOAD:
            loads.append((p_offset, p_vaddr))
    sections = [struct.unpack_from("<IIQQQQIIQQ", d, shoff + i * shentsize) for i in range(shnum)]
    tables = [sh for sh in sections if sh[1] in (SHT_DYNSYM, SHT_SYMTAB) and sh[9] >= SYM_SIZE]
    if sum(sh[5] // sh[9] for sh in tables) > elf.MAX_SYMBOLS:
        raise ValueError(f"over {elf.MAX_SYMBOLS} symbol entries")
    found: dict[bytes, int] = {}
    for sh in tables:
        strtab = sections[sh[6]]
        s_off, s_end = strtab[4], min(strtab[4] + strtab[5], len(d))
        n = min(sh[5], len(d) - sh[4]) // sh[9] if sh[4] < len(d) else 0
        if n <= 0:
            continue
        ent = np.frombuffer(d, np.uint8, n * sh[9], sh[4]).reshape(n, sh[9])
        names, values = _field(ent, 0, "<u4"), _field(ent, 8, "<u8")
        live = (_field(ent, 6, "<u2") != 0) & (values != 0)
        for want in _WANT:
            at = _name_offsets(d, want, s_off, s_end)
            if not at or want in found:
                continue
            hit = np.flatnonzero(live & np.isin(names, at))
            if len(hit):
                found[want] = int(values[hit[0]])
    return e_type, loads, found


def _field(ent: np.ndarray[Any, np.dtype[Any]], at: int,
           kind: str) -> np.ndarray[Any, np.dtype[Any]]:
    """One field of every symbol entry (rows of `ent`), `kind` bytes at offset `at`."""
    size = np.dtype(kind).itemsize
    return np.ascontiguousarray(ent[:, at : at + size]).view(kind).ravel()


def _name_offsets(d: bytes, name: bytes, start: int, end: int) -> list[int]:
    """Offsets (from `start`) in the string table d[start:end] at which `name` is a
    whole NUL-terminated string (or the tail of a longer one: names are tail-merged)."""
    out: list[int] = []
    needle = name + b"\0"
    at = d.find(needle, start, end)
    while at >= 0 and len(out) < MAX_NAME_HITS:
        out.append(at - start)
        at = d.find(needle, at + 1, end)
    return out


def _mappings(pid: int) -> list[tuple[int, int, str]]:
    """(start, file offset, path) of every file mapping of `pid`."""
    out = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].startswith("/"):
                out.append((int(parts[0].split("-")[0], 16), int(parts[2], 16),
                            parts[5].strip()))
    return out


def alive(pid: int) -> bool:
    """Is `pid` running (not gone, not a zombie whose memory is freed)?"""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :][:1] not in (b"Z", b"X", b"")


def _tids(pid: int) -> set[int]:
    try:
        return {int(t) for t in os.listdir(f"/proc/{pid}/task")}
    except OSError:
        return set()


def _thread_states(mem: Memory, lay: Layout, runtime: int) -> list[int]:
    """Thread state addresses of the main interpreter, as the probe walks them."""
    interp = mem.u64(runtime + lay.runtime_interp_head)
    out: list[int] = []
    ts = mem.u64(interp + lay.interp_threads) if interp else None
    while ts and len(out) < 32:
        out.append(ts)
        ts = mem.u64(ts + lay.ts_next)
    return out


def _pthread_tid_offset(mem: Memory, lay: Layout, states: list[int], tids: set[int]) -> int:
    """Where glibc's struct pthread holds the kernel tid: the offset at which every
    thread state's pthread_t points to one of the process's tids (3.10 keeps only
    pthread_self()). 0 when no single offset fits."""
    fits: set[int] | None = None
    for ts in states:
        pt = mem.u64(ts + lay.ts_tid)
        block = mem.read(pt, GLIBC_TID_SPAN) if pt else None
        if block is None:
            return 0
        here = {o for o in range(8, GLIBC_TID_SPAN, 4)
                if int.from_bytes(block[o : o + 4], "little") in tids}
        fits = here if fits is None else fits & here
    if not fits:
        return 0
    return min(fits)


class NotPython(Exception):
    """The process runs no CPython (nothing to say)."""


def find(pid: int) -> PyProcess:
    """The CPython of `pid`. Raises NotPython when none is mapped, LayoutError (one
    line for the manifest) when one is but cannot be walked with certainty."""
    try:
        maps = _mappings(pid)
    except OSError:
        raise NotPython() from None
    cands = sorted({p for _s, _o, p in maps if INTERPRETER_NAME.match(os.path.basename(p))},
                   key=lambda p: not os.path.basename(p).startswith("lib"))
    for path in cands:
        try:
            e_type, loads, syms = elf_objects(f"/proc/{pid}/root{path}")
        except (OSError, ValueError, IndexError, struct.error):
            continue
        if b"_PyRuntime" not in syms:
            continue
        return _place(pid, path, maps, e_type, loads, syms)
    raise NotPython()


def _place(pid: int, path: str, maps: list[tuple[int, int, str]], e_type: int,
           loads: list[tuple[int, int]], syms: dict[bytes, int]) -> PyProcess:
    name = os.path.basename(path)
    if e_type == ET_EXEC:
        base = 0
    else:
        first = min((s for s, o, p in maps if p == path and o == 0), default=None)
        if first is None:
            raise LayoutError(f"{name}: its first page is not mapped")
        base = first - min((v for o, v in loads if o == 0), default=0) // 4096 * 4096
    runtime = base + syms[b"_PyRuntime"]
    if b"PyCode_Type" not in syms:
        raise LayoutError(f"{name}: no PyCode_Type symbol")
    try:
        mem = Memory(pid)
    except OSError:
        raise NotPython() from None
    try:
        lay = _layout(mem, name, base, runtime, syms)
        states = _thread_states(mem, lay, runtime)
        tids = _tids(pid)
        if not states:
            raise LayoutError(f"CPython {lay.version[0]}.{lay.version[1]} ({name}): no thread "
                              "state where the layout says")
        pthread_tid = 0
        if lay.pthread_tid:
            pthread_tid = _pthread_tid_offset(mem, lay, states, tids)
            if not pthread_tid:
                raise LayoutError(f"CPython 3.10 ({name}): the tid of its threads was not "
                                  "found in glibc's struct pthread")
        elif not all(mem.u64(ts + lay.ts_tid) in tids for ts in states[-1:]):
            raise LayoutError(f"CPython {lay.version[0]}.{lay.version[1]} ({name}): its "
                              "thread states hold no thread id of the process")
    except LayoutError:
        mem.close()
        raise
    return PyProcess(pid, path, lay, runtime, base + syms[b"PyCode_Type"], pthread_tid, mem)


def _layout(mem: Memory, name: str, base: int, runtime: int, syms: dict[bytes, int]) -> Layout:
    """The layout of the interpreter: from Py_Version (3.11+) or the file name (3.10),
    and from _Py_DebugOffsets for 3.13."""
    m = INTERPRETER_NAME.match(name)
    assert m is not None
    version = (int(m.group(2)), int(m.group(3)))
    if b"Py_Version" in syms:
        raw = mem.read(base + syms[b"Py_Version"], 4)
        if raw is None:
            raise LayoutError(f"{name}: Py_Version unreadable")
        version = layouts.version_of(int.from_bytes(raw, "little"))
    label = f"CPython {version[0]}.{version[1]} ({name})"
    if version >= (3, 13):
        raw = mem.read(runtime, layouts.DEBUG_SIZE)
        try:
            return layouts.check(layouts.from_debug_offsets(raw or b""))
        except LayoutError as e:
            raise LayoutError(f"{label}: {e}") from None
    lay = layouts.TABLES.get(version)
    if lay is None:
        raise LayoutError(f"{label}: a version whose layout this gputrace does not know")
    return lay
