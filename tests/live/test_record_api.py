"""Live recordings of the API layer (uprobes on the stand-in libcuda) with the
FUSE stand-in driver, so one trace holds both layers (root, bcc, FUSE)."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from gputrace.trace.reader import open_trace
from tests.record_helpers import (
    DLOPEN_TWIN_GROUP,
    ROOT,
    RecorderProc,
    live_skip_reason,
    record_cmd,
    standin_driver_args,
)

pytestmark = [pytest.mark.live]
_SKIP = live_skip_reason()
if _SKIP is not None:
    pytestmark.append(pytest.mark.skip(reason=_SKIP))

DRIVER = standin_driver_args()
PROBED = {
    "cuMemAlloc_v2", "cuMemAllocPitch_v2", "cuMemFree_v2", "cuMemAllocManaged",
    "cuMemAllocHost_v2", "cuMemHostAlloc", "cuMemFreeHost", "cuMemCreate", "cuMemRelease",
    "cuMemMap", "cuMemUnmap", "cuMemAddressReserve", "cuMemAddressFree", "cuMemAllocAsync",
    "cuMemAllocAsync_ptsz", "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz",
    "cuMemFreeAsync", "cuMemFreeAsync_ptsz",
}  # fmt: skip
FREES = {"cuMemFree_v2", "cuMemFreeHost", "cuMemFreeAsync", "cuMemFreeAsync_ptsz",
         "cuMemAddressFree"}  # fmt: skip


def _expected() -> dict[str, Any]:
    from tests.standin_cuda.standin_cuda import load_expected_json

    return load_expected_json()


def _check_calls(calls: pl.DataFrame) -> None:
    """Exact counts and sizes per function, the failure, and alloc/free pairing."""
    exp = _expected()
    want = {k: v for k, v in exp["calls"].items() if k in PROBED}
    assert dict(Counter(calls["func"].to_list())) == want
    for sym in {a["symbol"] for a in exp["allocations"]}:
        got = sorted(calls.filter(pl.col("func") == sym)["size_bytes"].to_list())
        assert got == sorted(a["size"] for a in exp["allocations"] if a["symbol"] == sym), sym
    failed = calls.filter(pl.col("result") != 0)
    assert failed.select("func", "size_bytes", "result").rows() == [
        ("cuMemAlloc_v2", 1 << 40, 2)
    ]
    assert failed["ptr"][0] is None
    ok = calls.filter(pl.col("result") == 0).sort("ts_ns")
    live: dict[int, tuple[str, int]] = {}  # pointer -> (func, size), in time order
    for func, ptr, size in ok.select("func", "ptr", "size_bytes").rows():
        if func in FREES:
            assert ptr in live, (func, ptr)
            del live[ptr]
        elif ptr is not None and func not in ("cuMemMap", "cuMemUnmap"):
            assert ptr not in live, (func, ptr)
            live[ptr] = (func, size)
    assert len(live) == exp["leaks"]["count"] == 23
    assert set(live.values()) == {("cuMemAlloc_v2", 1 << 20)}
    created = ok.filter(pl.col("func") == "cuMemCreate")["handle"].to_list()
    assert created and created == ok.filter(pl.col("func") == "cuMemRelease")["handle"].to_list()
    assert created == ok.filter(pl.col("func") == "cuMemMap")["handle"].to_list()


def _leak_stacks(calls: pl.DataFrame, stacks: pl.DataFrame) -> list[list[str | None]]:
    """Symbols of the stacks of allocations never freed (pointers pair in time order)."""
    live: dict[int, tuple[int, int]] = {}
    ok = calls.filter(pl.col("result") == 0).sort("ts_ns")
    for func, ptr, pid, sid in ok.select("func", "ptr", "pid", "stack_id").rows():
        if func in FREES:
            live.pop(ptr, None)
        elif func == "cuMemAlloc_v2":
            live[ptr] = (pid, sid)
    out = []
    for pid, sid in live.values():
        fr = stacks.filter((pl.col("pid") == pid) & (pl.col("stack_id") == sid)).sort("depth")
        out.append(fr["symbol"].to_list())
    return out


def test_api_and_syscall_layers_exact(tmp_path: Path) -> None:
    from tests.standin.standin import mounted_driver
    from tests.standin_cuda.standin_cuda import build, workload_env

    paths = build()
    out = tmp_path / "trace"
    with mounted_driver(tmp_path, budget=256 << 20) as dev:
        r = subprocess.run(
            record_cmd(out, "--device-dir", str(dev), *DRIVER, "--",
                       str(paths.workload), "--quiet"),
            cwd=ROOT, capture_output=True, text=True, timeout=120, env=workload_env(dev),
        )  # fmt: skip
    assert r.returncode == 0, r.stderr
    t = open_trace(out)
    assert t.status == "complete"
    assert {"syscall", "api"} <= set(t.layers)
    assert sum(t.drops.values()) == 0 and "cuda_events" in t.drops
    api = t.manifest["api"]
    assert api["libraries"] == [str(paths.libcuda)]
    assert api["stack_errors"] == 0 and api["stack_frames"] > 0
    assert 0 <= api["unresolved_frames"] < api["stack_frames"]
    attached = t.manifest["hooks"]["attached"]
    assert f"uprobe:cuMemAlloc_v2@{paths.libcuda}" in attached
    skipped = {s["name"] for s in t.manifest["hooks"]["skipped"]}
    assert f"uprobe:cuMemAlloc_v2_ptds@{paths.libcuda}" in skipped
    calls = t.scan("cuda_calls").collect()
    _check_calls(calls)
    assert set(calls["comm"].to_list()) == {"cuda_workload"}
    assert (calls["latency_ns"] > 0).all()
    # the leaking function is named in every leaked allocation's stack
    leaks = _leak_stacks(calls, t.scan("stacks").collect())
    assert len(leaks) == 23
    assert all("leak_buffers" in syms and "main" in syms for syms in leaks)
    # stacks exist exactly for the allocation calls
    allocating = calls.filter(~pl.col("func").is_in([*FREES, "cuMemRelease", "cuMemMap",
                                                     "cuMemUnmap"]))  # fmt: skip
    assert allocating["stack_id"].null_count() == 0
    # syscall layer: the same process, the same clock
    ioctls = t.scan("ioctls").collect()
    pid = calls["pid"][0]
    assert set(calls["pid"].to_list()) == {pid}
    mine = ioctls.filter(pl.col("pid") == pid)
    assert mine.filter(pl.col("name") == "RM_ALLOC").height >= 20
    first_alloc = calls.filter(pl.col("func") == "cuMemAlloc_v2")["ts_ns"].min()
    assert ioctls["ts_ns"].min() < first_alloc < ioctls["ts_ns"].max()  # type: ignore[operator]
    # the 1 TiB cuMemAlloc_v2 failing with CUDA_ERROR_OUT_OF_MEMORY was heard from the
    # API probe's own record, and the GPU sampled for it, timed from its return
    oom = calls.filter((pl.col("result") == 2) & (pl.col("func") == "cuMemAlloc_v2"))
    rm_oom = ioctls.filter(pl.col("status") == 0x51)
    assert oom.height == 1
    assert t.manifest["oom_watch"]["failures"] == t.manifest["oom_watch"]["early"] == (
        oom.height + rm_oom.height)
    inc = t.scan("gpu_memory").filter(pl.col("trigger") == "incident").collect()
    ret = oom["ts_ns"][0] + oom["latency_ns"][0]
    assert ret in (inc["ts_ns"] - inc["delay_ns"]).to_list()


@pytest.mark.xdist_group(DLOPEN_TWIN_GROUP)
def test_api_dlopen_after_start(dlopen_twin: Any) -> None:
    """The twin dlopen()s libcuda after READY: the probe stops it at the open,
    the recorder attaches, and no call is missed. (The recording is shared with the
    library-load test of the default hook mechanism: tests/live/conftest.py.)"""
    t = dlopen_twin
    assert "api" in t.layers
    assert t.manifest["api"]["pauses"] >= 1
    calls = t.scan("cuda_calls").collect()
    _check_calls(calls)
    leaks = _leak_stacks(calls, t.scan("stacks").collect())
    assert len(leaks) == 23 and all("leak_buffers" in s for s in leaks)


# exclusive: a whole-host recording sees every process that loads a libcuda meanwhile;
# another worker's stand-in workload would be attached first (its path sorts first) and
# its calls counted as this one's
@pytest.mark.exclusive
def test_api_libcuda_option(tmp_path: Path) -> None:
    """Whole-host mode (no stopping): `--libcuda` attaches before the library is
    ever loaded, so even calls right after a dlopen are all seen."""
    from tests.standin_cuda.standin_cuda import build, run_workload

    lib = tmp_path / "lib" / "libcuda.so.1"
    lib.parent.mkdir()
    shutil.copy(build().libcuda, lib)
    out = tmp_path / "trace"
    rec = RecorderProc(record_cmd(out, "--libcuda", str(lib)))
    rec.wait_ready()
    line = next(x for x in rec.stderr if x.startswith("gputrace: recording ("))
    n = int(re.search(r"\((\d+) hooks", line).group(1))  # type: ignore[union-attr]
    r = run_workload("--quiet", "--dlopen", env={"GPUTRACE_STANDIN_LIBCUDA": str(lib)})
    assert r.returncode == 0, r.stderr
    rec.proc.send_signal(signal.SIGINT)
    assert rec.wait() == 0, "".join(rec.stderr)
    t = open_trace(out)
    hooks = t.manifest["hooks"]["attached"]
    # whole host: a copy of libcuda another process loads meanwhile (another test on
    # this host) is attached too, after the ones the ready line counted
    ours = [h for h in hooks if h.endswith(f"@{lib}")]
    assert set(ours) <= set(hooks[:n]) and n <= len(hooks)
    assert sum(h.startswith("uprobe:") for h in ours) == len(PROBED)
    assert sum(h.startswith("uretprobe:") for h in ours) == len(PROBED)
    assert t.manifest["api"]["libraries"][0] == str(lib)
    assert t.manifest["api"]["pauses"] == 0
    calls = t.scan("cuda_calls").collect()
    pids = calls.filter(pl.col("func") == "cuMemAlloc_v2")["pid"].unique().to_list()
    assert len(pids) == 1
    _check_calls(calls.filter(pl.col("pid") == pids[0]))


@pytest.mark.parametrize("make", ["missing", "text"])
def test_api_libcuda_option_rejected(tmp_path: Path, make: str) -> None:
    path = tmp_path / "libcuda.so.1"
    if make == "text":
        path.write_text("not an ELF file\n")
    r = subprocess.run(record_cmd(tmp_path / "t", "--libcuda", str(path), "--", "true"),
                       cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "--libcuda" in r.stderr
    assert not (tmp_path / "t").exists()
