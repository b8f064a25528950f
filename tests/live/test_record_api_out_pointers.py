"""Out pointers read right wherever they lie (live): the API layer takes an
allocation's result from the copy of the caller's frame that its stack walk's
first read made when the out pointer lies in it, and reads user memory
otherwise (probes/cuda.bpf.c). tests/standin_cuda/out_places.c puts out
pointers in the calling frame, on the heap, in a global, a frame 4 KiB up the
stack and at an unaligned address; the recorded pointers, pitch sizes and
handles must equal what each call returned."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gputrace.trace.reader import open_trace
from tests.record_helpers import ROOT, RUN_S, live_skip_reason, record_cmd

pytestmark = [pytest.mark.live]
_SKIP = live_skip_reason()
if _SKIP is not None:
    pytestmark.append(pytest.mark.skip(reason=_SKIP))

SOURCE = ROOT / "tests" / "standin_cuda" / "out_places.c"
PLACES = ["frame", "heap", "global", "far", "unaligned", "pitch", "handle"]


def test_out_pointers_read_wherever_they_lie(tmp_path: Path) -> None:
    from tests.standin_cuda.standin_cuda import StandinCudaUnavailable, link_program

    try:
        exe = link_program(SOURCE, tmp_path / "out_places")
    except StandinCudaUnavailable as e:
        pytest.skip(str(e))
    out = tmp_path / "trace"
    r = subprocess.run(record_cmd(out, "--no-driver-layer", "--", str(exe)), cwd=ROOT,
                       capture_output=True, text=True, timeout=RUN_S)  # fmt: skip
    assert r.returncode == 0, r.stderr
    want = []
    for line in r.stdout.splitlines():
        if line.startswith("OUT "):
            _, place, func, ptr, size = line.split()
            want.append((place, func, int(ptr.removeprefix("ptr="), 16),
                         int(size.removeprefix("size="))))  # fmt: skip
    assert [w[0] for w in want] == PLACES, r.stdout
    t = open_trace(out)
    assert t.status == "complete" and sum(t.drops.values()) == 0
    calls = t.scan("cuda_calls").collect().sort("ts_ns")
    got = [(func, handle if func == "cuMemCreate" else ptr, size)
           for func, ptr, handle, size in calls.select("func", "ptr", "handle",
                                                       "size_bytes").rows()]  # fmt: skip
    assert got == [(func, value, size) for _place, func, value, size in want]
    assert calls["result"].to_list() == [0] * len(PLACES)
    assert calls["stack_id"].null_count() == 0
