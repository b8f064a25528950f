"""Native frames through libraries without frame pointers in the MIDDLE of the
stack, from the process's first allocation on: does every cuMemAlloc_v2 of
tests/standin_cuda/chain_program carry exactly its call chain
main -> run -> chain_a -> chain_b -> chain_c -> cuMemAlloc_v2, where
libchain_a.so and libchain_c.so are built with -fomit-frame-pointer and
libchain_b.so and the program keep frame pointers (chain_libs.c)?

main's walk (tables for at most the 8 top frames while they lie in a library
with one, frame pointers from the first frame outside them, and tables loaded
only at a process's first API call) fails on it twice, recorded with
`gputrace record -- chain_program 3` from main (7cd6fe8):
- the first allocation, walked by frame pointers only (no table yet):
  [chain_c (libchain_c.so 0x1212)], nothing else: chain_c keeps a value in
  %rbp across its call, not a frame pointer, so the walk stops at once;
- the next two: [chain_c 0x1212, chain_b (libchain_b.so 0x1150),
  chain_a (libchain_a.so 0x1146)]: chain_c by its table, then frame pointers
  from chain_b, whose record gives chain_a's return address, but the %rbp
  chain_b saved is chain_a's reused register: run, main and libc are lost.
This walk unwinds each frame by its table where its library has one and by
its frame pointer elsewhere, and loads the tables at the libcuda load pause,
before the first call. The expected frames are the return addresses of the
calls in the built binaries (objdump)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gputrace.record.unwind import cfi, tables
from tests.record_helpers import live_skip_reason, record_alloc_stacks, return_addresses

CALLS = 3


@pytest.mark.live
@pytest.mark.skipif(live_skip_reason() is not None, reason=str(live_skip_reason()))
def test_unwinder_crosses_libraries_without_frame_pointers_mid_stack(tmp_path: Path) -> None:
    from tests.standin_cuda.standin_cuda import build

    lib_dir = build().lib_dir
    exe = lib_dir / "chain_program"
    a, b, c = (lib_dir / f"libchain_{x}.so" for x in "abc")
    prog, ra, rb, rc = (return_addresses(p) for p in (exe, a, b, c))
    t, stacks, stdout = record_alloc_stacks(
        tmp_path / "trace", ["--", str(exe), str(CALLS)], CALLS,
        ("module", "offset", "symbol"), 300)  # fmt: skip
    assert f"chain {CALLS}" in stdout
    libc = stacks[0][-1]  # main's caller, where the walk of main's frame ends
    assert libc[0] is not None and os.path.basename(libc[0]).startswith("libc.so")
    chain = [
        (str(c), rc[("chain_c", "cuMemAlloc_v2")], "chain_c"),
        (str(b), rb[("chain_b", "chain_c")], "chain_b"),
        (str(a), ra[("chain_a", "chain_b")], "chain_a"),
        (str(exe), prog[("run", "chain_a")], "run"),
        (str(exe), prog[("main", "run")], "main"),
        libc,
    ]
    # the first allocation of the process too: its tables were loaded when it
    # opened libcuda, before any call
    assert stacks == [chain] * CALLS
    # tables for the two libraries without frame pointers only
    api = t.manifest["api"]
    rows = {str(p): len(cfi.compile_file(str(p), tables.TABLE_ROWS).rows) for p in (a, c)}
    assert api["unwind"]["tables"] == [{"module": k, "rows": v} for k, v in sorted(rows.items())]
    assert api["unwind"]["skipped"] == [] and api["unwind"]["rows"] == sum(rows.values())
