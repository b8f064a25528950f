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

import pytest

from gputrace.record.unwind import cfi, tables
from tests.record_helpers import (
    API_STACKS_GROUP,
    CACHING_SEGMENTS,
    SharedRecording,
    alloc_stacks,
    live_skip_reason,
    return_addresses,
)

SEGMENTS = CACHING_SEGMENTS

Frame = tuple[str | None, int | None, str | None]


def _stacks(rec: SharedRecording) -> tuple[dict[str, object], list[list[Frame]]]:
    """The api manifest and each cuMemAlloc_v2's stack of the caching program as
    (module, offset, symbol), from its run in the shared default-options recording
    (tests/live/conftest.py). SEGMENTS + 1 allocations: the warm-up call from main,
    then the segments."""
    assert f"segments {SEGMENTS}" in rec.stdout["caching"]
    stacks = alloc_stacks(rec.trace, SEGMENTS + 1, ("module", "offset", "symbol"),
                          rec.pids["caching"])  # fmt: skip
    return rec.trace.manifest["api"], stacks


@pytest.mark.live
@pytest.mark.skipif(live_skip_reason() is not None, reason=str(live_skip_reason()))
@pytest.mark.xdist_group(API_STACKS_GROUP)
def test_unwinder_recovers_frames_through_a_library_without_frame_pointers(
        api_stacks: SharedRecording) -> None:  # fmt: skip
    exe, lib = api_stacks.paths["caching"], api_stacks.paths["caching_lib"]
    prog, cache = return_addresses(exe), return_addresses(lib)
    api, stacks = _stacks(api_stacks)
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
