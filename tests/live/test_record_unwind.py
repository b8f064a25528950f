"""Native frames through a library built without frame pointers: does every
segment allocation of the stand-in caching allocator (tests/standin_cuda/
caching_alloc.c, -O2 -fomit-frame-pointer) carry exactly the frames of its
call chain, main -> run -> alloc_tensor -> cache_alloc -> grow_segment ->
cuMemAlloc_v2, recovered from the library's .eh_frame?

Before the unwinder, the frame-pointer walk gave one frame per segment
allocation: [grow_segment+0x3f] (libcaching_standin.so 0x115f), and nothing
else: grow_segment keeps a size in %rbp across its call (0x400000), not a
frame pointer, so the walk stopped there; cache_alloc, alloc_tensor, run and
main were lost. (On a library that leaves %rbp alone the walk instead skips the
frames without a record and goes on from the next one: frames lost silently.)
The expected frames are the return addresses of the calls in the built
binaries (objdump), as tests/live/test_record_stack_walk.py finds them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gputrace.record.unwind import cfi, tables
from tests.record_helpers import live_skip_reason, record_alloc_stacks, return_addresses

SEGMENTS = 3

Frame = tuple[str | None, int | None, str | None]



def _record(tmp: Path, exe: Path) -> tuple[dict[str, object], list[list[Frame]]]:
    """The api manifest and each cuMemAlloc_v2's stack as (module, offset, symbol).
    SEGMENTS + 1 allocations: the warm-up call from main, then the segments."""
    t, stacks, stdout = record_alloc_stacks(
        tmp / "trace", ["--", str(exe), str(SEGMENTS)], SEGMENTS + 1,
        ("module", "offset", "symbol"), 300)
    assert f"segments {SEGMENTS}" in stdout
    return t.manifest["api"], stacks


@pytest.mark.live
@pytest.mark.skipif(live_skip_reason() is not None, reason=str(live_skip_reason()))
def test_unwinder_recovers_frames_through_a_library_without_frame_pointers(
        tmp_path: Path) -> None:  # fmt: skip
    from tests.standin_cuda.standin_cuda import build

    lib_dir = build().lib_dir
    exe, lib = lib_dir / "caching_program", lib_dir / "libcaching_standin.so"
    prog, cache = return_addresses(exe), return_addresses(lib)
    api, stacks = _record(tmp_path, exe)
    me, so = str(exe), str(lib)
    libc = stacks[0][-1]  # main's caller, where the walk of main's frame ends
    assert libc[0] is not None and os.path.basename(libc[0]).startswith("libc.so")
    assert stacks[0] == [(me, prog[("main", "cuMemAlloc_v2")], "main"), libc]
    segment = [
        (so, cache[("grow_segment", "cuMemAlloc_v2")], "grow_segment"),
        (so, cache[("cache_alloc", "grow_segment")], "cache_alloc"),
        (me, prog[("alloc_tensor", "cache_alloc")], "alloc_tensor"),
        (me, prog[("run", "alloc_tensor")], "run"),
        (me, prog[("main", "run")], "main"),
        libc,
    ]
    assert stacks[1:] == [segment] * SEGMENTS
    # one table, for the library without frame pointers only (the program and the
    # stand-in libcuda keep them; libc and the loader get none), with all its rows
    rows = len(cfi.compile_file(so, tables.TABLE_ROWS).rows)
    assert api["unwind"]["tables"] == [{"module": so, "rows": rows}]
    assert api["unwind"]["skipped"] == [] and api["unwind"]["rows"] == rows
