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
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

# DWARF register numbers on x86-64 (System V psABI, figure 3.36)
RBP, RSP, RA = 6, 7, 16
# row kinds (mirrored in probes/cuda_unwind.bpf.h)
STOP, CFA_RSP, CFA_RBP = 0, 1, 2
MAX_CFA = 0xFFFF  # the row's CFA offset field is a u16
MAX_RBP_SLOT = 0xFF  # %rbp's slot, in words below the CFA, is a u8


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


def warm() -> None:
    """Import pyelftools (a compile worker's first job: later ones start at once)."""
    with contextlib.suppress(ImportError):
        import elftools.elf.elffile  # noqa: F401


def compile_file(path: str, max_rows: int) -> UnwindTable:
    """The rows of `path`'s CFI, sorted by pc, adjacent equal rules merged.
    Raises CfiError when it has none, is not x86-64, or needs more than
    `max_rows` rows (a table that big is not loaded)."""
    try:
        from elftools.common.exceptions import ELFError
        from elftools.dwarf.callframe import FDE, CallFrameInfo
        from elftools.elf.elffile import ELFFile
    except ImportError:  # the record extra not installed: frame pointers only
        raise CfiError(
            f"{path}: pyelftools is not installed (pip install 'gputrace[record]')"
        ) from None

    try:
        with open(path, "rb") as f:
            ef = ELFFile(f)
            if ef["e_machine"] != "EM_X86_64":
                raise CfiError(f"{path}: not x86-64")
            dw = ef.get_dwarf_info(relocate_dwarf_sections=False, follow_links=False)
            if dw.has_EH_CFI():
                sec, eh = dw.eh_frame_sec, True
            elif dw.has_CFI():
                sec, eh = dw.debug_frame_sec, False
            else:
                raise CfiError(f"{path}: no .eh_frame or .debug_frame")
            # one entry at a time (pyelftools' EH_CFI_entries parses them all first):
            # a library over max_rows is refused once its unmerged rows pass the bound
            # by a quarter (below), not after all of its functions (PyTorch's
            # libraries hold millions: minutes in pure Python)
            cfi = CallFrameInfo(stream=sec.stream, size=sec.size, address=sec.address,
                                base_structs=dw.structs, for_eh_frame=eh)
            entries = _each_entry(cfi)
            spans: list[tuple[int, int, list[Row]]] = []
            fp = fp_bytes = code_bytes = unmerged = 0
            for e in entries:
                if not isinstance(e, FDE):
                    continue
                start, size = e["initial_location"], e["address_range"]
                rows = [_row(line["pc"], line) for line in e.get_decoded().table]
                uses_fp = any(r.kind == CFA_RBP for r in rows)
                fp += uses_fp
                fp_bytes += size if uses_fp else 0
                code_bytes += size
                spans.append((start, start + size, rows))
                # merging removes ~4% (rules repeated across a function's end, on
                # libstdc++, libbpf, libcrypto): a quarter more unmerged is over
                unmerged += len(rows) + 1  # its STOP row at the end
                if unmerged > max_rows + max_rows // 4:
                    raise CfiError(f"{path}: more than {max_rows} unwind rows (stopped "
                                   f"after {len(spans)} functions, {unmerged} rows unmerged)")
    except (OSError, ELFError, KeyError, ValueError, AttributeError) as e:
        if isinstance(e, CfiError):
            raise
        raise CfiError(f"{path}: unreadable call frame information ({e})") from None
    return UnwindTable(_merge(spans, max_rows, path), len(spans), fp, code_bytes, fp_bytes)


def _each_entry(cfi: Any) -> Iterator[Any]:
    """The CIEs and FDEs of a CallFrameInfo in section order, parsed as asked for
    (the loop of its own `_parse_entries`, pinned pyelftools 0.32)."""
    offset = 0
    while offset < cfi.size:
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
