"""Thread names (comm) recorded exactly while they change (live): each layer
keeps a thread's name in its per-thread storage instead of reading it at every
event, and a tp_btf program on task_rename keeps that copy true
(probes/comm_cache.bpf.h). The workload (tests/standin_cuda/rename_workload.c)
renames threads by prctl, through /proc from another thread, and by exec, with
an ioctl and an allocation and free in every phase; each row must carry the
name its thread had then."""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from gputrace.trace.reader import open_trace
from tests.record_helpers import ROOT, RUN_S, live_skip_reason, record_cmd

pytestmark = [pytest.mark.live]
_SKIP = live_skip_reason()
if _SKIP is not None:
    pytestmark.append(pytest.mark.skip(reason=_SKIP))

SOURCE = ROOT / "tests" / "standin_cuda" / "rename_workload.c"
NAMES = ["rn-start", "rn-prctl", "rn-prctl", "rn-proc", "rename_workload"]


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from tests.standin_cuda.standin_cuda import StandinCudaUnavailable, link_program

    tmp = tmp_path_factory.mktemp("rename")
    try:
        exe = link_program(SOURCE, tmp / "rename_workload")
    except StandinCudaUnavailable as e:
        pytest.skip(str(e))
    dev = tmp / "dev"
    dev.mkdir()
    os.mknod(dev / "nvidiactl", 0o666 | 0o020000, os.makedev(1, 3))
    return exe, dev


@pytest.mark.parametrize("hooks", ["tracepoint", "tp_btf"])
def test_renamed_threads_named_exactly(tmp_path: Path, workload: tuple[Path, Path],
                                       hooks: str) -> None:  # fmt: skip
    exe, dev = workload
    out = tmp_path / "trace"
    r = subprocess.run(
        record_cmd(out, "--device-dir", str(dev), "--no-driver-layer", "--",
                   str(exe), str(dev / "nvidiactl")),
        cwd=ROOT, capture_output=True, text=True, timeout=RUN_S,
        env={**os.environ, "GPUTRACE_SYSCALL_HOOKS": hooks},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    phases = [(int(w[1]), w[2]) for w in (ln.split() for ln in r.stdout.splitlines())
              if w and w[0] == "PHASE"]  # fmt: skip
    assert [name for _tid, name in phases] == NAMES, r.stdout
    assert "DONE" in r.stdout
    t = open_trace(out)
    assert t.status == "complete" and sum(t.drops.values()) == 0
    assert t.manifest["syscall_hooks"]["mechanism"] == hooks
    assert t.manifest["syscall_hooks"]["comm_cache"] == "tp_btf task_rename"
    assert t.manifest["api"]["comm_cache"] == "tp_btf task_rename"
    want = Counter(phases)
    ioctls = t.scan("ioctls").collect()
    assert Counter(ioctls.select("tid", "comm").rows()) == want
    calls = t.scan("cuda_calls").collect()
    assert Counter(calls.select("tid", "comm").rows()) == want + want  # an alloc and a free
    assert Counter(calls["func"].to_list()) == {"cuMemAlloc_v2": 5, "cuMemFree_v2": 5}
