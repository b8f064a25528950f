#!/usr/bin/env python3
"""How long compiling a library's unwind table takes, and what refusing a library
over the row bound early saves. Run from the repository root (no root needed):

    python3 benchmarks/unwind_compile/run.py [LIBRARY ...]

For each library (by default the large ones of this machine that exist: libstdc++,
libcrypto, libz3, libLLVM-14, libclang-cpp), side by side in one run: the section's
size; "every entry" = pyelftools parsing and decoding every FDE of it first (what
compile_file did before it parsed entries one at a time); "compile_file" = the
recorder's compile now (gputrace/record/unwind/cfi.py), refusing a library over
TABLE_ROWS after a quarter more unmerged rows; and what it gave. Then the worker's
round trip (gputrace/record/unwind/tables.py `Compiler`: spawn, then one compile).
Best of --repeat wall seconds each.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from gputrace.record.unwind import cfi, tables

DEFAULT = ["libstdc++.so.6", "libcrypto.so.3", "libz3.so.4", "libLLVM-14.so.1",
           "libclang-cpp.so.14"]
LIBDIR = "/usr/lib/x86_64-linux-gnu"


def every_entry(path: str) -> tuple[int, int]:
    """(FDEs, rows before merging): every entry parsed and decoded."""
    from elftools.dwarf.callframe import FDE
    from elftools.elf.elffile import ELFFile

    with open(path, "rb") as f:
        dw = ELFFile(f).get_dwarf_info(relocate_dwarf_sections=False, follow_links=False)
        entries = dw.EH_CFI_entries() if dw.has_EH_CFI() else dw.CFI_entries()
        fdes = [e for e in entries if isinstance(e, FDE)]
        return len(fdes), sum(len(e.get_decoded().table) for e in fdes)


def section_bytes(path: str) -> int:
    from elftools.elf.elffile import ELFFile

    with open(path, "rb") as f:
        ef = ELFFile(f)
        sec = ef.get_section_by_name(".eh_frame") or ef.get_section_by_name(".debug_frame")
        return int(sec["sh_size"]) if sec is not None else 0


def best(fn: object, repeat: int) -> tuple[float, object]:
    out: object = None
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        try:
            out = fn()  # type: ignore[operator]
        except cfi.CfiError as e:
            out = str(e).split(": ", 1)[-1]
        times.append(time.perf_counter() - t)
    return min(times), out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("libs", nargs="*")
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    libs = a.libs or [p for n in DEFAULT if os.path.exists(p := f"{LIBDIR}/{n}")]
    print("| library | CFI bytes | every entry (s) | compile_file (s) | compile_file gave |")
    print("|---|---|---|---|---|")
    for lib in libs:
        t_all, (fdes, rows) = best(lambda lib=lib: every_entry(lib), a.repeat)  # type: ignore[misc]
        t_new, got = best(lambda lib=lib: cfi.compile_file(lib, tables.TABLE_ROWS), a.repeat)
        gave = (f"{len(got.rows)} rows" if isinstance(got, cfi.UnwindTable) else str(got))
        print(f"| {os.path.basename(lib)} | {section_bytes(lib):,} | {t_all:.2f} "
              f"({fdes:,} FDEs, {rows:,} rows) | {t_new:.2f} | {gave} |")
    small = libs[0] if libs else sys.executable
    c = tables.Compiler()
    t = time.perf_counter()
    c.start()
    c.submit(small).result()
    first = time.perf_counter() - t
    t = time.perf_counter()
    c.submit(small).result()
    again = time.perf_counter() - t
    c.close()
    print(f"\nworker: spawn + first compile of {os.path.basename(small)} {first:.2f} s; "
          f"the next compile {again:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
