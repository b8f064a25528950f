"""`record --stack-depth N`: allocation stacks cut at exactly N frames (live, on
the stand-in libcuda with a known deep stack), and invalid values refused with a
one-line error before anything is started."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gputrace.errors import UsageError
from gputrace.record.api import libcuda as cuda
from tests.record_helpers import (
    API_STACKS_GROUP,
    ROOT,
    STORM_DEPTH,
    STORM_DEPTH_CALLS,
    SharedRecording,
    alloc_stacks,
    live_skip_reason,
    record_alloc_stacks,
    record_cmd,
)

DEPTH = STORM_DEPTH  # frames of storm.c's descend() below main: a framework's deep stack
CALLS = STORM_DEPTH_CALLS


Frame = tuple[str | None, int | None]


def _record(tmp: Path, exe: Path, *opts: str) -> tuple[dict[str, object], list[list[Frame]]]:
    """The api manifest and each allocation's stack as (module, offset) frames,
    innermost first (offsets do not move between runs, addresses do). CALLS + 1
    allocations: storm.c's warm-up call, then the storm."""
    t, stacks, _ = record_alloc_stacks(
        tmp / f"trace{'-'.join(opts)}", [*opts, "--", str(exe), str(CALLS), "-", str(DEPTH)],
        CALLS + 1, ("module", "offset"), 120)
    return t.manifest["api"], stacks


@pytest.mark.live
@pytest.mark.skipif(live_skip_reason() is not None, reason=str(live_skip_reason()))
@pytest.mark.xdist_group(API_STACKS_GROUP)
def test_stack_depth_cuts_stacks_exactly(tmp_path: Path, api_stacks: SharedRecording) -> None:
    """The full stacks come from the shared default-options recording (the same storm
    run there, tests/live/conftest.py); the cut ones from a recording of its own."""
    exe = api_stacks.paths["storm"]
    full_api = api_stacks.trace.manifest["api"]
    full = alloc_stacks(api_stacks.trace, CALLS + 1, ("module", "offset"),
                        api_stacks.pids["depth-full"])  # fmt: skip
    cut_api, cut = _record(tmp_path, exe, "--stack-depth", "8")
    assert full_api["stack_depth"] == 127 and cut_api["stack_depth"] == 8
    # the storm's allocations come from DEPTH + 1 frames of descend() below main
    assert max(len(s) for s in full) > DEPTH + 2
    assert [len(s) for s in cut] == [min(len(s), 8) for s in full]
    assert sum(len(s) == 8 for s in cut) == CALLS  # the warm-up's stack is shallower
    # the same calls, each stack its full one's innermost 8 frames
    assert cut == [s[:8] for s in full]
    # one stack id per distinct stack still: the warm-up call and the storm
    assert len({tuple(s) for s in cut}) == 2


@pytest.mark.parametrize("value", ["0", "128", "-1", "8x", "", "1e2", "99999999999999999999"])
def test_stack_depth_rejected(tmp_path: Path, value: str) -> None:
    out = tmp_path / "t"
    r = subprocess.run(record_cmd(out, "--stack-depth", value, "--", "true"), cwd=ROOT,
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gputrace: error: --stack-depth"), r.stderr
    assert not out.exists()


def test_stack_depth_reaches_the_probe_as_a_number() -> None:
    assert "-DGT_CUDA_STACK_DEPTH=127" in cuda.cflags()
    assert "-DGT_CUDA_STACK_DEPTH=16" in cuda.cflags(stack_depth=16)
    for bad in (0, 128, -5):
        with pytest.raises(UsageError, match="--stack-depth"):
            cuda.cflags(stack_depth=bad)
    src = (ROOT / "probes" / "cuda_common.bpf.h").read_text()
    assert "u64 ip[GT_CUDA_STACK_DEPTH]" in src


def test_stack_depth_in_ebpf_listing() -> None:
    r = subprocess.run(record_cmd(Path("unused"), "--stack-depth", "12", "--ebpf"), cwd=ROOT,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "-DGT_CUDA_STACK_DEPTH=12" in r.stdout
