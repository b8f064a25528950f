"""The native unwinder's rows (gputrace/record/unwind/cfi.py): does .eh_frame of
the stand-in caching allocator (built -O2 -fomit-frame-pointer) compile into
exactly the rules its code follows? The truth is the functions' prologues in
the built library (objdump of grow_segment: push %r12; push %rbp; push %rbx;
sub $0x10,%rsp, then the call to cuMemAlloc_v2; cache_alloc: push %rbp;
push %rbx; sub $0x68,%rsp), which `readelf -wF` shows as the same table."""

from __future__ import annotations

import re
import subprocess

import pytest

from gputrace.record.unwind import cfi
from tests.standin_cuda.standin_cuda import build, skip_reason

pytest.importorskip("elftools")
pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))


def _symbol(path: str, name: str) -> tuple[int, int]:
    """(start, end) of a function symbol, from nm."""
    out = subprocess.run(["nm", "-S", path], check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        f = line.split()
        if len(f) == 4 and f[3] == name:
            return int(f[0], 16), int(f[0], 16) + int(f[1], 16)
    raise AssertionError(f"{name} not in {path}")


def _rule(table: cfi.UnwindTable, pc: int) -> cfi.Row:
    return [r for r in table.rows if r.pc <= pc][-1]


def _call_site(path: str, func: str, callee: str) -> int:
    """Address of the call to `callee` inside `func` (objdump)."""
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", path], check=True,
                          capture_output=True, text=True).stdout  # fmt: skip
    inside = False
    for line in text.splitlines():
        if m := re.match(r"^[0-9a-f]+ <([^>]+)>:$", line):
            inside = m.group(1) == func
        elif inside and (m := re.match(rf"^\s+([0-9a-f]+):\s+call\s+\S+ <{callee}", line)):
            return int(m.group(1), 16)
    raise AssertionError(f"no call to {callee} in {func}")


def test_rows_of_a_library_without_frame_pointers() -> None:
    lib = str(build().lib_dir / "libcaching_standin.so")
    t = cfi.compile_file(lib, 1 << 16)
    assert not t.has_frame_pointers and t.fp_functions == 0
    # grow_segment at its call to cuMemAlloc_v2: 3 pushes and 16 bytes of locals
    # above the return address (CFA = rsp + 48), %rbp pushed second (CFA - 24)
    call = _call_site(lib, "grow_segment", "cuMemAlloc_v2")
    assert _rule(t, call) == cfi.Row(_rule(t, call).pc, cfi.CFA_RSP, 48, 3)
    # cache_alloc at its call to grow_segment: push %rbp (CFA - 16), push %rbx,
    # sub $0x68: CFA = rsp + 8 + 8 + 8 + 0x68 = rsp + 128
    call = _call_site(lib, "cache_alloc", "grow_segment")
    assert _rule(t, call) == cfi.Row(_rule(t, call).pc, cfi.CFA_RSP, 128, 2)
    # each function starts with the CFA at rsp + 8, %rbp unchanged
    for name in ("grow_segment", "cache_alloc", "cache_release_all"):
        start, end = _symbol(lib, name)
        assert _rule(t, start) == cfi.Row(start, cfi.CFA_RSP, 8, 0)
        # past its end, before whatever follows: no rule (or the next function's)
        assert any(r.pc == end for r in t.rows) or _rule(t, end).pc > start
    # rows are sorted, and no row repeats the rule before it
    assert [r.pc for r in t.rows] == sorted({r.pc for r in t.rows})
    assert all(a.pack()[1:] != b.pack()[1:] for a, b in zip(t.rows, t.rows[1:], strict=False))


def test_plt_expression_rows_stop_the_walk() -> None:
    """The PLT's CFA is a DWARF expression of %rip: a STOP row, never a guess."""
    lib = str(build().lib_dir / "libcaching_standin.so")
    plt = subprocess.run(["objdump", "-h", lib], check=True, capture_output=True,
                         text=True).stdout  # fmt: skip
    m = re.search(r"\s\.plt\s+([0-9a-f]+)\s+([0-9a-f]+)", plt)
    assert m is not None
    start, size = int(m.group(2), 16), int(m.group(1), 16)
    t = cfi.compile_file(lib, 1 << 16)
    # PLT0 pushes twice (rsp + 16, rsp + 24), the entries after it are expressions
    assert _rule(t, start) == cfi.Row(start, cfi.CFA_RSP, 16, 0)
    assert _rule(t, start + 16).kind == cfi.STOP
    assert _rule(t, start + size - 1).kind == cfi.STOP


def test_program_with_frame_pointers_gets_no_table() -> None:
    exe = str(build().lib_dir / "caching_program")
    t = cfi.compile_file(exe, 1 << 16)
    assert t.has_frame_pointers  # main, run and alloc_tensor move the CFA to %rbp
    assert t.fp_functions == 3


def test_too_many_rows_is_refused() -> None:
    lib = str(build().lib_dir / "libcaching_standin.so")
    with pytest.raises(cfi.CfiError, match="more than 10 unwind rows"):
        cfi.compile_file(lib, 10)


def test_not_an_elf_file() -> None:
    with pytest.raises(cfi.CfiError):
        cfi.compile_file("/proc/self/status", 10)
