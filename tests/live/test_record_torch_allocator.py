"""The torch_allocator layer, live, on the stand-in libc10_cuda.so (tests/standin_torch:
PyTorch's mangled names over a tiny caching allocator on the stand-in libcuda), called
from Python through ctypes: every tensor's pointer, size, Python line and free, the
planted leak by its line, growth per iteration and an out-of-memory failure whose cache
state is known, in the allocator tables and reports (root, bcc)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from gputrace.trace.reader import open_trace
from tests.record_helpers import ROOT, live_skip_reason
from tests.standin_torch import standin_torch as st

# one worker: the module's recording fixture is made once (tests/test_live_groups.py)
pytestmark = [pytest.mark.live, pytest.mark.xdist_group("torch_allocator_live")]
_SKIP = live_skip_reason()
if _SKIP is not None:
    pytestmark.append(pytest.mark.skip(reason=_SKIP))

KIB, MIB = 1 << 10, 1 << 20
CAP = "64M"  # the stand-in libcuda's largest allocation: the 96 MiB request fails


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, st.Run]:
    """One recording for the whole module (each costs ~13 s of CPU): weights, four
    iterations of the loop, then the out-of-memory request."""
    out = tmp_path_factory.mktemp("torch") / "trace"
    run = st.record(out, sys.executable, "--iterations", "4", "--oom",
                    env={"GPUTRACE_STANDIN_CUDA_MAX": CAP})  # fmt: skip
    return out, run


def _frames(t: Any) -> dict[int, list[tuple[str, str, int]]]:
    fr = t.scan("allocator_frames").collect().sort("stack_id", "depth")
    out: dict[int, list[tuple[str, str, int]]] = {}
    for sid, fn, file, line in fr.select("stack_id", "function", "filename", "line").rows():
        out.setdefault(sid, []).append((fn, file, line))
    return out


def test_every_tensor_and_free(recorded: tuple[Path, st.Run]) -> None:
    trace, run = recorded
    t = open_trace(trace)
    assert "allocator" in t.layers
    man = t.manifest["torch_allocator"]
    assert man["skipped"] == [] and man["libraries"][0]["release"] == "2.14"
    ev = t.scan("allocator_events").collect().filter(pl.col("pid") == run.pid).sort("seq")
    frames = _frames(t)
    allocs = ev.filter(pl.col("action") == "alloc")
    # every tensor the program made, in order: pointer, size, device, its Python line
    want_line = {w: st.plant_line(w) for w in ("weight", "activation", "leak")}
    got = [(a, s, frames[sid][0]) for a, s, sid in
           allocs.select("address", "size_bytes", "stack_id").rows()]
    assert [(a, s) for a, s, _ in got] == [(p, st.block_round(n)) for p, n, _ in run.tensors]
    for (_a, _s, top), (_p, _n, where) in zip(got, run.tensors, strict=True):
        fn = {"weight": "weights", "activation": "step", "leak": "step"}[where]
        assert top == (fn, str(st.WORKLOAD), want_line[where])
    assert set(allocs["device"].to_list()) == {0}
    # every free, by pointer, requested then completed at the same instant
    frees = ev.filter(pl.col("action") == "free_completed")
    assert frees["address"].to_list() == run.freed
    req = ev.filter(pl.col("action") == "free_requested")
    assert req["ts_ns"].to_list() == frees["ts_ns"].to_list()


def test_reports_leak_growth_pool(recorded: tuple[Path, st.Run]) -> None:
    trace, run = recorded
    leak = f"step ({st.WORKLOAD}:{st.plant_line('leak')})"
    # tensors alive at the end: the weights and the four planted 256 KiB tensors
    tens = st.analyze_json(trace, "tensors")["tensors"]
    assert tens["total_count"] == 3 + 4
    by_top = {s["site"]: s for s in tens["by_stack"]}  # the site with its full path
    assert by_top[leak]["count"] == 4 and by_top[leak]["bytes"] == 4 * 256 * KIB
    assert by_top[leak]["requested_bytes"] == 4 * 256 * KIB
    # growth: the leak's line retains 256 KiB per iteration, the activation nothing
    growth = st.analyze_json(trace, "allocator-growth")["allocator_growth"]
    rows = {s["site"]: s for s in growth["by_stack"]}
    assert rows[leak]["retained_bytes_per_alloc"] == 256 * KIB
    act = f"step ({st.WORKLOAD}:{st.plant_line('activation')})"
    assert rows[act]["allocs"] == 4 and rows[act]["retained_bytes"] == 0
    assert growth["start_active_bytes"] == 0
    assert growth["end_active_bytes"] == run.allocated
    # the pool at the end is what the allocator itself counts
    pool = st.analyze_json(trace, "allocator-pool")["allocator_pool"]
    assert pool["reserved_bytes"] == run.reserved
    assert pool["allocated_bytes"] == run.allocated


def test_out_of_memory_with_its_cache(recorded: tuple[Path, st.Run]) -> None:
    """The 96 MiB request: the stand-in libcuda refuses it, the allocator frees its
    one unused cached segment (the 4 MiB the activations used), fails again and
    throws. The recording holds that segment's free, then the oom entry on the line
    that asked; the program lived on (no uretprobe in the exception's way)."""
    trace, run = recorded
    assert run.ooms == [96 * MIB]
    t = open_trace(trace)
    ev = t.scan("allocator_events").collect().filter(pl.col("pid") == run.pid).sort("seq")
    oom = ev.filter(pl.col("action") == "oom")
    assert oom.height == 1 and oom["size_bytes"][0] == 96 * MIB
    frames = _frames(t)
    assert frames[oom["stack_id"][0]][0] == ("too_big", str(st.WORKLOAD), st.plant_line("oom"))
    act_ptr = next(p for p, _n, w in run.tensors if w == "activation")
    seg_free = ev.filter(pl.col("action") == "segment_free")
    assert seg_free.select("address", "size_bytes").rows() == [(act_ptr, 4 * MIB)]
    # the cache released before the retry that failed too, then the oom entry
    assert seg_free["ts_ns"][0] < oom["ts_ns"][0]
    segs = t.scan("allocator_segments").collect().filter(pl.col("pid") == run.pid)
    assert segs["total_size_bytes"].sum() == run.reserved


def test_release_shapes_and_unknown_skipped(tmp_path: Path) -> None:
    """Three processes at once: two map a libc10_cuda in 2.5's and 2.1's shapes (free
    inlined into local_raw_delete and raw_delete; 2.1's malloc takes an int device),
    traced as exactly as 2.14's; the third one whose malloc takes one more argument
    (no release table matches): skipped with its reason, one line in the manifest and
    in `doctor`, and not one row of its tensors."""
    st.build()
    doctor: list[str] = []

    def run_doctor() -> None:
        r = subprocess.run([sys.executable, "-m", "gputrace.cli", "doctor"], cwd=ROOT,
                           capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
        doctor.extend(r.stdout.splitlines())

    out = tmp_path / "trace"
    v25, v21, unknown = st.record_many(
        out, [(sys.executable, st.LIB_2_5, ("--iterations", "2")),
              (sys.executable, st.LIB_2_1, ("--iterations", "3")),
              (sys.executable, st.LIB_UNKNOWN, ())], while_alive=run_doctor)  # fmt: skip
    t = open_trace(out)
    man = t.manifest["torch_allocator"]
    assert sorted(x["release"] for x in man["libraries"]) == ["2.1", "2.5"]
    why = "no NativeCachingAllocator::malloc/free in .symtab (a PyTorch release this gputrace "
    assert man["skipped"] == [{"name": f"torch_allocator@{st.LIB_UNKNOWN}",
                               "reason": f"{st.LIB_UNKNOWN}: {why}has no table for)"}]
    torch_line = [x for x in doctor if x.startswith("torch ")]
    assert len(torch_line) == 1 and "warn" in torch_line[0]
    assert f"{st.LIB_UNKNOWN}: {why}has no table for); the torch_allocator layer skips it" \
        in torch_line[0]
    ev = t.scan("allocator_events").collect()
    assert ev.filter(pl.col("pid") == unknown.pid).height == 0
    for run in (v25, v21):
        mine = ev.filter(pl.col("pid") == run.pid).sort("seq")
        allocs = mine.filter(pl.col("action") == "alloc")
        assert allocs.select("address", "size_bytes", "device").rows() == [
            (p, st.block_round(n), 0) for p, n, _ in run.tensors]
        frees = mine.filter(pl.col("action") == "free_completed")
        assert frees["address"].to_list() == run.freed


def test_flight_recorder_incident_holds_the_allocator(tmp_path: Path) -> None:
    """`--keep` and `--freeze-on oom`: the out-of-memory failure of the 96 MiB request
    freezes an incident whose trace holds the tensors alive, the oom entry on the
    line that asked, the cached segment freed at the failure and the allocator's
    state: the oom report measures the cache at the failure (reserved minus
    allocated, from the allocator's own rows)."""
    out = tmp_path / "trace"
    run = st.record(out, sys.executable, "--iterations", "2", "--oom",
                    record_args=("--keep", "60s", "--freeze-on", "oom"),
                    env={"GPUTRACE_STANDIN_CUDA_MAX": CAP})  # fmt: skip
    m = open_trace(out).manifest
    assert [i["trigger"] for i in m["incidents"]] == ["oom"]
    inc_dir = out / m["incidents"][0]["dir"]
    inc = open_trace(inc_dir)
    assert "allocator" in inc.layers
    ev = inc.scan("allocator_events").collect().filter(pl.col("pid") == run.pid)
    oom = ev.filter(pl.col("action") == "oom")
    assert oom["size_bytes"].to_list() == [96 * MIB]
    assert _frames(inc)[oom["stack_id"][0]][0][2] == st.plant_line("oom")
    act_ptr = next(p for p, _n, w in run.tensors if w == "activation")
    assert ev.filter(pl.col("action") == "segment_free")["address"].to_list() == [act_ptr]
    tens = st.analyze_json(inc_dir, "tensors")["tensors"]
    assert tens["total_count"] == 3 + 2
    report = st.analyze_json(inc_dir, "oom")["oom"]
    owned = [i for i in report["incidents"] if i["allocator_entry"] is not None]
    assert len(owned) == 1 and owned[0]["gpu_index"] == 0
    # after its cache was released: the segments still holding tensors, less the tensors
    assert owned[0]["allocator_pool_bytes"] == run.reserved - run.allocated
    assert [(h["allocator_reserved_bytes"], h["allocator_allocated_bytes"])
            for h in owned[0]["holders"]] == [(run.reserved, run.allocated)]


def test_a_uretprobe_on_malloc_would_kill_the_program() -> None:
    """Why malloc's return is probed at its `ret` instructions: with a uretprobe on
    malloc, the OutOfMemoryError it throws finds the kernel's return trampoline on the
    stack, no unwind information there, and the program dies in std::terminate
    (SIGABRT) instead of catching it. (With the layer's probes it lives on:
    test_out_of_memory_with_its_cache.)"""
    from gputrace.record import loader
    from gputrace.record.torch_allocator import symbols

    lib = st.build()
    bpf = loader.import_bcc().BPF(text="int on_return(void *ctx) { return 0; }")
    try:
        bpf.attach_uretprobe(name=str(lib), addr=symbols.find(str(lib)).malloc,
                             fn_name="on_return")  # fmt: skip
        r = subprocess.run([sys.executable, str(st.WORKLOAD), str(lib), "--oom", "--iterations",
                            "1"], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "GPUTRACE_STANDIN_CUDA_MAX": CAP})  # fmt: skip
    finally:
        bpf.cleanup()
    assert r.returncode == -6, (r.returncode, r.stderr)
    assert "terminate called after throwing an instance of 'c10::OutOfMemoryError'" in r.stderr
    r = subprocess.run([sys.executable, str(st.WORKLOAD), str(lib), "--oom", "--iterations", "1"],
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "GPUTRACE_STANDIN_CUDA_MAX": CAP})  # fmt: skip
    assert r.returncode == 0 and f"OOM {96 * MIB}" in r.stdout


def test_launched_program(tmp_path: Path) -> None:
    """`record --torch-stacks full -- python workload`: the library is found when the
    program loads it (the API layer pauses it at its libcuda load, libc10_cuda is
    mapped by then), every tensor of the run is a row from its first one, and each
    stack starts with its native frames, as an API-layer stack does at its call's
    return: the C entry point ctypes called malloc from, libffi's, then Python's."""
    from tests.record_helpers import record_cmd

    out = tmp_path / "trace"
    r = subprocess.run(record_cmd(out, "--torch-stacks", "full", "--", sys.executable,
                                  str(st.WORKLOAD), str(st.build()), "--iterations", "3"),
                       cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    run = st.Run(0)
    for line in r.stdout.splitlines():
        if line.split()[0] in ("T", "F"):
            st._said(run, line)
    assert len(run.tensors) == 3 + 2 * 3
    t = open_trace(out)
    assert [x["release"] for x in t.manifest["torch_allocator"]["libraries"]] == ["2.14"]
    ev = t.scan("allocator_events").collect().sort("seq")
    assert ev["pid"].n_unique() == 1
    allocs = ev.filter(pl.col("action") == "alloc")
    assert allocs.select("address", "size_bytes").rows() == [
        (p, st.block_round(n)) for p, n, _ in run.tensors]
    assert allocs["stack_id"].null_count() == 0
    assert ev.filter(pl.col("action") == "free_completed")["address"].to_list() == run.freed
    assert t.manifest["torch_allocator"]["stacks"] == "full"
    for sid in allocs["stack_id"].unique().to_list():
        names = [f[0] for f in _frames(t)[sid]]
        assert names[0] == "standin_torch_malloc"
        assert "ffi_call" in names and names.index("ffi_call") < names.index("main")
