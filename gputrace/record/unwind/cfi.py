"""x86-64 call frame information (.eh_frame, else .debug_frame) compiled into
compact unwind rows for the API probe's native unwinder (probes/cuda_unwind.bpf.h).

Each row covers the addresses from its `pc` to the next row's and says how to
find the caller from a frame stopped there: CFA = rsp + N or rbp + N; the
return address at CFA - 8; %rbp saved at CFA - 8k, or unchanged. Anything else
(a DWARF expression, a CFA in another register, a return address elsewhere, an
offset that does not fit) compiles to a STOP row: the walk ends there rather
than guess a frame. PLT entries (their CFA is an expression of %rip) are STOP
rows too: no uretprobe stack has a return address inside a PLT stub.
Gaps between functions are STOP rows. Parsed with pyelftools.

The files are any a traced process maps executable, so the compile is bounded
whatever they hold (docs/security.md, "Unwind tables"): the section is read
through a window on the file, never whole; an entry (CIE or FDE) over
MAX_ENTRY_BYTES is refused before it is parsed; every entry counts against the
row bound, and an FDE's rows are counted from its instructions before they are
decoded; a library costs at most MAX_COMPILE_CPU_S of the worker's CPU; the
worker's address space is capped at WORKER_MEMORY_BYTES. A library over any bound
is refused with a reason that says so (BOUND in it: kept by the cache).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import resource
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

# DWARF register numbers on x86-64 (System V psABI, figure 3.36)
RBP, RSP, RA = 6, 7, 16
# row kinds (mirrored in probes/cuda_unwind.bpf.h)
STOP, CFA_RSP, CFA_RBP = 0, 1, 2
MAX_CFA = 0xFFFF  # the row's CFA offset field is a u16
MAX_RBP_SLOT = 0xFF  # %rbp's slot, in words below the CFA, is a u8
MAX_ENTRY_BYTES = 64 << 10
"""The largest CIE or FDE compiled: libLLVM-15's largest FDE is 1.7 KiB (98,257 of
them); one of 64 KiB already describes tens of thousands of rows."""
MAX_CIES = 8192
"""CIEs in one library: the linker merges equal ones (libLLVM-15 has 1 for 98,257
FDEs); a .debug_frame has at most one per compilation unit."""
MAX_COMPILE_CPU_S = 30.0
"""CPU seconds of the worker one library may take (the largest honest ones are
refused over TABLE_ROWS in ~2 s): CPU time, not wall time, so a busy host does
not refuse a library that an idle one would compile."""
WORKER_MEMORY_BYTES = 2 << 30
"""The compile worker's address space (RLIMIT_AS): a spawned interpreter with
pyelftools is ~0.1 GiB; an honest compile adds tens of MiB."""
BOUND = "over the bound"
"""In every refusal for a bound: the refusal depends on the file alone (kept)."""
_ADVANCES = (0x01, 0x02, 0x03, 0x04)  # DW_CFA_set_loc, DW_CFA_advance_loc1/2/4
_ADVANCE_LOC = 0x40  # DW_CFA_advance_loc: its high two bits (the delta in the low six)


def _advances(op: int) -> bool:
    """Does the CFI instruction `op` start a new row?"""
    return op & 0xC0 == _ADVANCE_LOC or op in _ADVANCES


class CfiError(ValueError):
    """The file has no usable call frame information."""


@dataclass(frozen=True)
class Row:
    pc: int  # link-time address where the row starts
    kind: int  # STOP, CFA_RSP or CFA_RBP
    cfa: int = 0  # CFA = register + cfa
    rbp: int = 0  # %rbp saved at CFA - 8 * rbp; 0: unchanged

    def pack(self) -> tuple[int, int, int, int]:
        return self.pc, self.cfa, self.kind, self.rbp


@dataclass(frozen=True)
class UnwindTable:
    rows: list[Row]
    functions: int  # FDEs compiled
    fp_functions: int  # FDEs whose CFA moves to %rbp: built with frame pointers
    code_bytes: int = 0  # bytes the FDEs cover
    fp_bytes: int = 0  # of which in functions with frame pointers
    # (device, inode) of the file read (fstat of its fd); not part of the table itself
    file: tuple[int, int] = field(default=(0, 0), compare=False)

    @property
    def has_frame_pointers(self) -> bool:
        """Most of the code (by bytes: the C runtime's small start-up stubs keep
        none, whatever the program) sets up %rbp as a frame pointer: the FP walk
        is right (and cheaper) there. A library built without them has few or none."""
        return self.code_bytes > 0 and 2 * self.fp_bytes >= self.code_bytes


def _row(pc: int, line: dict[Any, Any]) -> Row:
    """One decoded CFI line as a row (STOP when it is not of the compact forms)."""
    from elftools.dwarf.callframe import RegisterRule

    cfa = line.get("cfa")
    ra = line.get(RA)
    if cfa is None or cfa.expr is not None or cfa.reg not in (RSP, RBP):
        return Row(pc, STOP)
    if ra is None or ra.type != RegisterRule.OFFSET or ra.arg != -8:
        return Row(pc, STOP)
    if not 0 <= cfa.offset <= MAX_CFA:
        return Row(pc, STOP)
    rbp, rule = 0, line.get(RBP)
    if rule is not None and rule.type == RegisterRule.OFFSET:
        if rule.arg >= 0 or rule.arg % 8 or -rule.arg // 8 > MAX_RBP_SLOT:
            return Row(pc, STOP)
        rbp = -rule.arg // 8
    elif rule is not None and rule.type not in (RegisterRule.SAME_VALUE,):
        return Row(pc, STOP)  # %rbp in another register, or undefined: not followed
    return Row(pc, CFA_RSP if cfa.reg == RSP else CFA_RBP, cfa.offset, rbp)


def worker_init(parent: int) -> None:
    """A compile worker dies with the recorder (PR_SET_PDEATHSIG): a recorder that is
    SIGKILLed leaves no worker behind. Linux only, as the recorder is."""
    import ctypes
    import signal

    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the recorder died before the prctl
        os._exit(1)
    with contextlib.suppress(OSError, ValueError):  # a hostile library cannot take the host's
        resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_BYTES, WORKER_MEMORY_BYTES))
    # none of the recorder's stdio: a worker left asleep in a hostile close (beyond
    # SIGKILL) would hold the pipe the recorder's stderr goes to, whose reader (`| tee`,
    # a test) then never sees it end; its failures come back through the pool
    with contextlib.suppress(OSError):
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
    # ...nor its end of the pipe to multiprocessing's resource tracker, which holds the
    # recorder's stderr until every end is closed (the worker needs no tracker)
    from multiprocessing import resource_tracker

    tracker = getattr(resource_tracker, "_resource_tracker", None)
    theirs = getattr(tracker, "_fd", None)
    if isinstance(theirs, int):
        with contextlib.suppress(OSError):
            os.close(theirs)
        setattr(tracker, "_fd", None)  # noqa: B010 (a private attribute)


def warm() -> None:
    """Import pyelftools (a compile worker's first job: later ones start at once)."""
    with contextlib.suppress(ImportError):
        import elftools.elf.elffile  # noqa: F401


MAPPED_SECTION_BYTES = 256 << 20
"""A section up to this size is read through a mapping of its pages (no system call per
read); a larger one through the file (either way, never copied whole)."""


class _Window:
    """A read-only stream on bytes [base, base + size) of a file: the section, read
    as parsed (pyelftools' DWARF reader copies a section whole into memory)."""

    def __init__(self, f: Any, base: int, size: int) -> None:
        self.f, self.base, self.size, self.pos = f, base, size, 0
        self.mm: mmap.mmap | None = None
        if size <= MAPPED_SECTION_BYTES:
            start = base - base % mmap.ALLOCATIONGRANULARITY
            with contextlib.suppress(OSError, ValueError):  # past the end: read instead
                self.mm = mmap.mmap(f.fileno(), base + size - start, access=mmap.ACCESS_READ,
                                    offset=start)
                self.base = base - start

    def read(self, n: int = -1) -> bytes:
        n = self.size - self.pos if n < 0 else min(n, max(self.size - self.pos, 0))
        if self.mm is not None:
            at = self.base + self.pos
            data: bytes = self.mm[at : at + n]
        else:
            self.f.seek(self.base + self.pos)
            data = self.f.read(n)
        self.pos += len(data)
        return data

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self.pos = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: self.size}[whence] + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def close(self) -> None:
        if self.mm is not None:
            self.mm.close()


def compile_file(path: str, max_rows: int, fd: int | None = None) -> UnwindTable:
    """The rows of `path`'s CFI (read from `fd` when given: the descriptor whose
    identity the caller took), sorted by pc, adjacent equal rules merged. Raises
    CfiError when it has none, is not x86-64, or is over a bound (more than
    `max_rows` rows, among them: such a table is not loaded)."""
    try:
        from elftools.common.exceptions import ELFError
        from elftools.elf.elffile import ELFFile
    except ImportError:  # the record extra not installed: frame pointers only
        raise CfiError(
            f"{path}: pyelftools is not installed (pip install 'gputrace[record]')"
        ) from None

    try:
        with (open(fd, "rb", closefd=False) if fd is not None
              else open(path, "rb")) as f:
            ef = ELFFile(f)
            if ef["e_machine"] != "EM_X86_64":
                raise CfiError(f"{path}: not x86-64")
            spans, fp, fp_bytes, code_bytes = _spans(path, f, ef, max_rows)
    except MemoryError:
        raise CfiError(f"{path}: {BOUND} of the worker's memory "
                       f"({WORKER_MEMORY_BYTES >> 20} MiB)") from None
    except (OSError, ELFError, KeyError, ValueError, AttributeError, TypeError) as e:
        if isinstance(e, CfiError):
            raise
        raise CfiError(f"{path}: unreadable call frame information ({e})") from None
    return UnwindTable(_merge(spans, max_rows, path), len(spans), fp, code_bytes, fp_bytes)


def _spans(path: str, f: Any, ef: Any,
           max_rows: int) -> tuple[list[tuple[int, int, list[Row]]], int, int, int]:
    """(start, end, rows) of each FDE, and the frame-pointer counts, each entry parsed
    as it is reached and counted against the bounds before it is decoded."""
    from elftools.dwarf.callframe import CallFrameInfo
    from elftools.dwarf.structs import DWARFStructs

    sec, eh = ef.get_section_by_name(".eh_frame"), True
    if sec is None or sec["sh_type"] == "SHT_NOBITS" or not sec["sh_size"]:
        sec, eh = ef.get_section_by_name(".debug_frame"), False
    if sec is None or sec["sh_type"] == "SHT_NOBITS" or not sec["sh_size"]:
        raise CfiError(f"{path}: no .eh_frame or .debug_frame")
    structs = DWARFStructs(little_endian=ef.little_endian, dwarf_format=32,
                           address_size=ef.elfclass // 8)
    stream = _Window(f, sec["sh_offset"], sec["sh_size"])
    # one entry at a time (pyelftools' EH_CFI_entries parses them all first): a
    # library over max_rows is refused once its unmerged rows pass the bound by a
    # quarter (below), not after all of its functions (PyTorch's libraries hold
    # millions: minutes in pure Python)
    try:
        return _compile_entries(path, CallFrameInfo(stream=stream, size=sec["sh_size"],
                                                    address=sec["sh_addr"],
                                                    base_structs=structs, for_eh_frame=eh),
                                max_rows)
    finally:
        stream.close()


def _compile_entries(path: str, cfi: Any,
                     max_rows: int) -> tuple[list[tuple[int, int, list[Row]]], int, int, int]:
    from elftools.dwarf.callframe import CIE, FDE

    spans: list[tuple[int, int, list[Row]]] = []
    fp = fp_bytes = code_bytes = unmerged = cies = 0
    # merging removes ~4% (rules repeated across a function's end, on libstdc++,
    # libbpf, libcrypto): a quarter more unmerged is over
    bound = max_rows + max_rows // 4
    cpu_end = time.process_time() + MAX_COMPILE_CPU_S
    for e in _each_entry(cfi, path):
        # every entry costs a row, a CIE too (a million CIEs are a million parses)
        unmerged += 1
        if isinstance(e, FDE):
            # an FDE's rows are one per advance (and its first): counted undecoded
            unmerged += 1 + sum(_advances(i.opcode) for i in e.instructions)
        elif isinstance(e, CIE):
            cies += 1
            if cies > MAX_CIES:
                raise CfiError(f"{path}: more than {MAX_CIES} CIEs, {BOUND}")
        if unmerged > bound:
            raise CfiError(f"{path}: more than {max_rows} unwind rows, {BOUND} (stopped "
                           f"after {len(spans)} functions, {unmerged} rows unmerged)")
        if not len(spans) % 64 and time.process_time() > cpu_end:  # a system call: not each
            raise CfiError(f"{path}: more than {MAX_COMPILE_CPU_S:g} CPU seconds, {BOUND} "
                           f"(stopped after {len(spans)} functions)")
        if not isinstance(e, FDE):
            continue
        cfi._entry_cache.pop(e.offset, None)  # kept by pyelftools: FDEs are read once
        start, size = e["initial_location"], e["address_range"]
        rows = [_row(line["pc"], line) for line in e.get_decoded().table]
        uses_fp = any(r.kind == CFA_RBP for r in rows)
        fp += uses_fp
        fp_bytes += size if uses_fp else 0
        code_bytes += size
        spans.append((start, start + size, rows))
    return spans, fp, fp_bytes, code_bytes


def _each_entry(cfi: Any, path: str) -> Iterator[Any]:
    """The CIEs and FDEs of a CallFrameInfo in section order, parsed as asked for
    (the loop of its own `_parse_entries`, pinned pyelftools 0.32); an entry over
    MAX_ENTRY_BYTES is refused from its length field, before it is parsed."""
    import struct

    offset = 0
    while offset < cfi.size:
        cfi.stream.seek(offset)
        head = cfi.stream.read(12)
        if len(head) < 4:
            raise CfiError(f"{path}: unreadable call frame information (cut short)")
        (length,) = struct.unpack_from("<I", head)
        if length == 0xFFFFFFFF and len(head) == 12:
            (length,) = struct.unpack_from("<Q", head, 4)
        if length > MAX_ENTRY_BYTES:
            raise CfiError(f"{path}: an entry of {length} bytes at offset {offset}, "
                           f"{BOUND} of {MAX_ENTRY_BYTES} bytes")
        yield cfi._parse_entry_at(offset)
        offset = cfi.stream.tell()


def _merge(spans: list[tuple[int, int, list[Row]]], max_rows: int, path: str) -> list[Row]:
    """Sorted rows with a STOP row at each function's end (unless the next one
    starts there), and no row that repeats the rule before it."""
    out: list[Row] = []
    for start, end, rows in sorted(spans, key=lambda s: s[0]):
        if out and out[-1].pc > start:
            continue  # overlapping FDEs: keep the first, never mix two functions' rules
        for r in rows:
            if start <= r.pc < end and not (out and out[-1].pack()[1:] == r.pack()[1:]):
                out.append(r)
        out.append(Row(end, STOP))
    # a STOP at a function's end followed by its neighbour's first row at the same pc
    rows_by_pc: dict[int, Row] = {}
    for r in out:
        rows_by_pc[r.pc] = r  # the later row (the next function's) wins
    merged: list[Row] = []
    for pc in sorted(rows_by_pc):
        r = rows_by_pc[pc]
        if not (merged and merged[-1].pack()[1:] == r.pack()[1:]):
            merged.append(r)
    if len(merged) > max_rows:
        raise CfiError(f"{path}: more than {max_rows} unwind rows")
    return merged
