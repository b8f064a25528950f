"""The API layer's own frame-pointer walk (probes/cuda.bpf.c cuda_stack_id):
does it record exactly the frames the kernel's walker (bpf_get_stackid) did,
no more, and one stack id per distinct stack? Live, on the stand-in libcuda with
storm.c at known depths; the expected frames are the return addresses of the
calls in the built binary (objdump), which is what the kernel's walker
recorded for the same program before (frame 0 the call site in the caller,
then one per frame up to glibc's __libc_start_call_main, where its walk ended)."""

from __future__ import annotations

import os

import pytest

from tests.record_helpers import (
    API_STACKS_GROUP,
    STORM_WALK_CALLS,
    STORM_WALK_DEPTHS,
    SharedRecording,
    alloc_stacks,
    live_skip_reason,
    return_addresses,
)

CALLS = STORM_WALK_CALLS

Frame = tuple[str | None, int | None]


def _stacks(rec: SharedRecording, depth: int | str) -> tuple[list[list[Frame]], int]:
    """Each allocation's stack of the storm at `depth` as (module, offset) frames,
    innermost first, and the number of distinct stack ids its process has in the stacks
    table (the storm's run in the shared recording, tests/live/conftest.py)."""
    pid = rec.pids[f"walk-{depth}"]
    stacks = alloc_stacks(rec.trace, CALLS + 1, ("module", "offset"), pid)
    # CALLS + 1 allocations: the warm-up call, then the storm; frees carry no stack
    calls = rec.trace.scan("cuda_calls").collect()
    calls = calls.filter(calls["pid"] == pid)
    frees = calls.filter(calls["func"] == "cuMemFree_v2")
    assert frees.height == CALLS + 1 and frees["stack_id"].null_count() == CALLS + 1
    stack_rows = rec.trace.scan("stacks").collect()
    distinct = stack_rows.filter(stack_rows["pid"] == pid).select("stack_id").unique().height
    return stacks, distinct


@pytest.mark.live
@pytest.mark.skipif(live_skip_reason() is not None, reason=str(live_skip_reason()))
@pytest.mark.xdist_group(API_STACKS_GROUP)
@pytest.mark.parametrize("depth", STORM_WALK_DEPTHS)
def test_stack_walk_records_the_kernel_walkers_frames(api_stacks: SharedRecording,
                                                      depth: int | str) -> None:  # fmt: skip
    """40b: frames of 256 bytes of locals (descend_big), so the walk reads across
    several pages, each from its first record to the page's end."""
    exe = api_stacks.paths["storm"]
    ret = return_addresses(exe)
    stacks, distinct = _stacks(api_stacks, depth)
    me = str(exe)
    # main's own frame ends in glibc's __libc_start_call_main (no symbol in a
    # stripped libc): the last frame the kernel's walker read, and ours
    libc = stacks[0][-1]
    assert libc[0] is not None and os.path.basename(libc[0]).startswith("libc.so")
    warm_up = [(me, ret[("main", "cuMemAlloc_v2")]), libc]
    # storm() is inlined into descend(): its call site, DEPTH recursive calls, main's call
    if isinstance(depth, int):
        storm = ([(me, ret[("descend", "cuMemAlloc_v2")])]
                 + [(me, ret[("descend", "descend")])] * depth
                 + [(me, ret[("main", "descend")]), libc])  # fmt: skip
    else:  # descend_big DEPTH times, then descend(0)
        storm = ([(me, ret[("descend", "cuMemAlloc_v2")]), (me, ret[("descend_big", "descend")])]
                 + [(me, ret[("descend_big", "descend_big")])] * int(depth[:-1])
                 + [(me, ret[("main", "descend_big")]), libc])  # fmt: skip
    assert stacks == [warm_up] + [storm] * CALLS
    assert distinct == 2  # one id per distinct stack, not one per event
