"""The TEST STAND-IN libcuda and its known workload (tests/standin_cuda) do what the
API-layer tests will rely on: the symbols are there with their own bodies, the workload
makes exactly the calls expected.json lists, stacks walk by frame pointer, and with the
FUSE stand-in driver mounted the library issues the RM/UVM traffic the real one does."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.standin_cuda.standin_cuda import (
    EXTRA_SYMBOLS,
    REQUIRED_SYMBOLS,
    Paths,
    build,
    driver_summary,
    load_expected_json,
    parse_calls,
    parse_driver_log,
    run_workload,
    skip_reason,
    waiting_workload,
    workload_env,
)

try:
    from tests.standin.standin import mounted_driver, read_state, wait_state
    from tests.standin.standin import skip_reason as fuse_skip_reason

    FUSE_SKIP = fuse_skip_reason()
except ImportError:  # the FUSE stand-in is not in this checkout
    FUSE_SKIP = "tests/standin (FUSE stand-in driver) is not available"

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")

MIB = 1 << 20


@pytest.fixture(scope="module")
def paths() -> Paths:
    return build()


@pytest.fixture(scope="module")
def exp() -> dict[str, Any]:
    return load_expected_json()


def _check_run(r: subprocess.CompletedProcess[str], exp: dict[str, Any]) -> None:
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines()[-1] == "DONE"
    calls = parse_calls(r.stdout)
    by_fn: dict[str, Counter[str]] = {}
    for c in calls:
        by_fn.setdefault(c.function, Counter())[c.symbol] += 1
    assert {f: dict(c) for f, c in by_fn.items()} == exp["calls_by_function"]
    allocating = {a["symbol"] for a in exp["allocations"]}
    got = [(c.function, c.symbol, c.size, c.result) for c in calls if c.symbol in allocating]
    want = [(a["function"], a["symbol"], a["size"], a["result"]) for a in exp["allocations"]]
    assert got == want
    leaked = [c for c in calls if c.function == "leak_buffers"]
    assert len(leaked) == exp["leaks"]["count"] == 23
    assert sum(c.size for c in leaked) == exp["leaks"]["bytes"] == 23 * MIB
    assert len({c.ptr for c in leaked}) == 23


# ------------------------------------------------------------------- the library


def test_required_symbols_exported_with_own_bodies(paths: Paths) -> None:
    if shutil.which("nm") is None:
        pytest.skip("nm not found (binutils)")
    out = subprocess.run(["nm", "-D", "--defined-only", str(paths.libcuda)], capture_output=True,
                         text=True, check=True).stdout
    syms = {}
    for line in out.splitlines():
        addr, kind, name = line.split()
        syms[name] = (int(addr, 16), kind)
    for name in (*REQUIRED_SYMBOLS, *EXTRA_SYMBOLS):
        assert name in syms, f"{name} not exported"
        assert syms[name][1] == "T", f"{name} is {syms[name][1]}, not a function in .text"
    addrs = [syms[n][0] for n in (*REQUIRED_SYMBOLS, *EXTRA_SYMBOLS)]
    assert len(set(addrs)) == len(addrs), "two exported symbols share one body"
    # nothing but the API is exported
    assert {n for n in syms if not n.startswith("cu")} <= {"_init", "_fini"}


def test_exported_symbols_set_up_frame_first(paths: Paths) -> None:
    """push %rbp; mov %rsp,%rbp as the first two instructions: stack walks from any
    point inside the call (an ioctl deeper down, say) pass through these frames."""
    if shutil.which("objdump") is None:
        pytest.skip("objdump not found (binutils)")
    for name in (*REQUIRED_SYMBOLS, *EXTRA_SYMBOLS):
        out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", f"--disassemble={name}",
                              str(paths.libcuda)], capture_output=True, text=True,
                             check=True).stdout
        body = out.split(f"<{name}>:\n", 1)[1].splitlines()[:2]
        insns = [" ".join(line.split("\t")[-1].split()) for line in body]
        assert insns == ["push %rbp", "mov %rsp,%rbp"], (name, insns)


def test_soname_and_dev_symlink(paths: Paths) -> None:
    if shutil.which("readelf") is None:
        pytest.skip("readelf not found (binutils)")
    dyn = subprocess.run(["readelf", "-d", str(paths.libcuda)], capture_output=True, text=True,
                         check=True).stdout
    assert "Library soname: [libcuda.so.1]" in dyn
    link = paths.lib_dir / "libcuda.so"
    assert link.is_symlink() and link.resolve() == paths.libcuda.resolve()
    linked = subprocess.run(["readelf", "-d", str(paths.workload)], capture_output=True,
                            text=True, check=True).stdout
    assert "Shared library: [libcuda.so.1]" in linked
    twin = subprocess.run(["readelf", "-d", str(paths.workload_dlopen)], capture_output=True,
                          text=True, check=True).stdout
    assert "libcuda" not in twin


_ERRORS_SCRIPT = r"""
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1])
u64 = ctypes.c_ulonglong
p = u64(0)
out = {}
out["alloc_before_init"] = lib.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(16))
out["init"] = lib.cuInit(0)
out["alloc_no_ctx"] = lib.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(16))
ctx = ctypes.c_void_p()
out["ctx"] = lib.cuCtxCreate_v2(ctypes.byref(ctx), 0, 0)
out["null_out"] = lib.cuMemAlloc_v2(None, ctypes.c_size_t(16))
out["null_out_managed"] = lib.cuMemAllocManaged(None, ctypes.c_size_t(16), 1)
out["null_out_host"] = lib.cuMemAllocHost_v2(None, ctypes.c_size_t(16))
out["over_cap"] = lib.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t((1 << 30) + 1))
out["at_cap"] = lib.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(1 << 30))
out["free_at_cap"] = lib.cuMemFree_v2(p)
out["free_again"] = lib.cuMemFree_v2(p)
out["free_unknown"] = lib.cuMemFree_v2(u64(0x1234))
out["freehost_unknown"] = lib.cuMemFreeHost(ctypes.c_void_p(0x1234))
out["release_unknown"] = lib.cuMemRelease(u64(0x1234))
out["destroy"] = lib.cuCtxDestroy_v2(ctx)
print(json.dumps(out))
"""


def test_error_results(paths: Paths) -> None:
    r = subprocess.run([sys.executable, "-c", _ERRORS_SCRIPT, str(paths.libcuda)],
                       capture_output=True, text=True, check=True,
                       env={"PATH": "/usr/bin:/bin"})
    got = json.loads(r.stdout)
    assert got == {
        "alloc_before_init": 3, "init": 0, "alloc_no_ctx": 201, "ctx": 0,
        "null_out": 1, "null_out_managed": 1, "null_out_host": 1,
        "over_cap": 2, "at_cap": 0, "free_at_cap": 0, "free_again": 1,
        "free_unknown": 1, "freehost_unknown": 1, "release_unknown": 1, "destroy": 0,
    }


# ------------------------------------------------------------------ the workload


def test_print_expected_equals_expected_json(paths: Paths, exp: dict[str, Any]) -> None:
    for exe in (paths.workload, paths.workload_dlopen):
        r = subprocess.run([str(exe), "--print-expected"], capture_output=True, text=True,
                           check=True)
        assert json.loads(r.stdout) == exp


def test_expected_json_is_self_consistent(exp: dict[str, Any]) -> None:
    total: Counter[str] = Counter()
    for calls in exp["calls_by_function"].values():
        total.update(calls)
    assert dict(total) == exp["calls"]
    per_fn_sym = Counter((a["function"], a["symbol"]) for a in exp["allocations"])
    for (fn, sym), n in per_fn_sym.items():
        assert exp["calls_by_function"][fn][sym] == n
    assert exp["leaks"]["count"] == 23
    assert exp["leaks"]["bytes"] == 23 * exp["leaks"]["size_each"] == 23 * MIB
    assert [a for a in exp["allocations"] if a["result"] != 0] == [
        {k: v for k, v in f.items() if k != "result_name"} | {"freed_by": None}
        for f in exp["failed"]]
    drv = exp["driver"]
    sizes = [s for v in drv["rm_alloc_vidmem_sizes_by_function"].values() for s in v]
    assert len(sizes) == drv["rm_alloc_by_class"]["0x40"]
    assert drv["leaked_vidmem_bytes"] == sum(drv["rm_alloc_vidmem_sizes_by_function"]
                                             ["leak_buffers"])


def test_workload_without_driver(exp: dict[str, Any]) -> None:
    r = run_workload(log=True)
    _check_run(r, exp)
    ops = parse_driver_log(r.stderr)
    assert ops and all(o.fields.get("dry") == "1" for o in ops)
    _check_driver(driver_summary(ops), exp)


def _check_driver(s: dict[str, Any], exp: dict[str, Any]) -> None:
    drv = exp["driver"]
    assert s["rm_alloc_by_class"] == drv["rm_alloc_by_class"]
    want_sizes = [x for v in drv["rm_alloc_vidmem_sizes_by_function"].values() for x in v]
    assert s["rm_alloc_vidmem_sizes"] == want_sizes
    assert s["rm_alloc_failed"] == []
    assert s["rm_alloc_memory_sizes"] == drv["rm_alloc_memory_os_descriptor"]["sizes"]
    assert s["rm_free_vidmem"] == drv["rm_free_vidmem"]
    assert s["rm_free_total"] == drv["rm_free_total"]
    assert s["uvm"] == drv["uvm"]
    assert s["managed_mmaps"] == drv["managed_mmaps"]
    assert s["managed_munmaps"] == drv["managed_munmaps"]
    assert s["statuses"] == ["0x0"]


def test_ctx_destroy_frees_what_is_left(exp: dict[str, Any]) -> None:
    r = run_workload("--quiet", "--ctx-destroy", log=True)
    assert r.returncode == 0, r.stderr
    s = driver_summary(parse_driver_log(r.stderr))
    opt = exp["optional"]["--ctx-destroy"]["driver"]
    assert s["rm_free_vidmem"] == exp["driver"]["rm_free_vidmem"] + opt["rm_free_vidmem"]
    assert s["uvm"]["UVM_FREE"] == exp["driver"]["uvm"]["UVM_FREE"] + opt["UVM_FREE"]
    assert s["uvm"]["UVM_UNREGISTER_GPU"] == 1


def test_wait_linked_has_libcuda_mapped(paths: Paths, exp: dict[str, Any]) -> None:
    with waiting_workload("--quiet") as w:
        maps = Path(f"/proc/{w.pid}/maps").read_text()
        assert str(paths.libcuda.resolve()) in maps
        rc, out, err = w.go()
    assert rc == 0, err
    assert out.splitlines()[-1] == "DONE"


def test_dlopen_loads_library_after_ready(paths: Paths, exp: dict[str, Any]) -> None:
    with waiting_workload(dlopen=True) as w:
        maps = Path(f"/proc/{w.pid}/maps").read_text()
        assert "libcuda" not in maps
        rc, out, err = w.go()
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0] == f"LOADED {paths.libcuda.resolve()}"
    assert lines[-1] == "DONE"
    # the dlopen'ed calls come from the same named functions
    r = subprocess.CompletedProcess(args=[], returncode=rc, stdout=out, stderr=err)
    _check_run(r, exp)


def test_dlopen_flag_on_linked_binary_keeps_pid() -> None:
    with waiting_workload("--dlopen", "--quiet") as w:
        exe = Path(f"/proc/{w.pid}/exe").resolve()
        assert exe.name == "cuda_workload_dlopen"
        assert "libcuda" not in Path(f"/proc/{w.pid}/maps").read_text()
        rc, out, err = w.go()
    assert rc == 0, err
    assert out.splitlines()[-1] == "DONE"


@pytest.mark.exclusive  # gdb's breakpoints beside another test's uprobes on this libcuda
def test_frame_pointer_backtrace_reaches_main(paths: Paths) -> None:
    if shutil.which("gdb") is None:
        pytest.skip("gdb not found")
    r = subprocess.run(
        ["gdb", "-batch", "-nx", "-ex", "set debuginfod enabled off",
         "-ex", "break leak_buffers", "-ex", "run", "-ex", "break cuMemAlloc_v2",
         "-ex", "continue", "-ex", "bt", "--args", str(paths.workload), "--quiet"],
        capture_output=True, text=True, timeout=120, check=False)
    frames = [ln for ln in r.stdout.splitlines() if ln.startswith("#")]
    if not frames:
        pytest.skip(f"gdb could not run the workload here (ptrace?): {r.stderr[-300:]}")
    assert "cuMemAlloc_v2" in frames[0]
    assert "leak_buffers" in frames[1]
    assert "main" in frames[2]


# ------------------------------------------------------ with the FUSE stand-in driver


@pytest.mark.live  # needs the FUSE stand-in: CI fails when it skips
@pytest.mark.skipif(FUSE_SKIP is not None, reason=FUSE_SKIP or "")
def test_workload_on_fuse_driver(tmp_path: Path, exp: dict[str, Any]) -> None:
    with mounted_driver(tmp_path, budget=64 * MIB, gpus=1) as dev:
        r = run_workload(devdir=dev, log=True)
        _check_run(r, exp)
        ops = parse_driver_log(r.stderr)
        assert not any("dry" in o.fields for o in ops)
        opened = [Path(o.fields["path"]).name for o in ops if o.op == "OPEN"]
        assert opened == ["nvidiactl", "nvidia-uvm", "nvidia0"]
        _check_driver(driver_summary(ops), exp)
        st = wait_state(dev, lambda s: s.scalars.get("clients") == 0)
        assert st.scalars["clients"] == 0  # the exit closed the fds: RM freed the client
        assert st.gpus[0]["peak"] == exp["driver"]["peak_vidmem_bytes"]
        assert st.gpus[0]["used"] == 0


@pytest.mark.live  # needs the FUSE stand-in: CI fails when it skips
@pytest.mark.skipif(FUSE_SKIP is not None, reason=FUSE_SKIP or "")
def test_leaked_blocks_live_on_fuse_driver_until_exit(paths: Paths, tmp_path: Path,
                                                      exp: dict[str, Any]) -> None:
    drv = exp["driver"]
    with mounted_driver(tmp_path, budget=64 * MIB) as dev:
        proc = subprocess.Popen([str(paths.workload), "--quiet", "--hold"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=workload_env(dev))
        try:
            assert proc.stdout is not None and proc.stdin is not None
            assert proc.stdout.readline() == "DONE\n"
            st = read_state(dev)
            vid = [o for o in st.objects if o["class"] == 0x40]
            assert len(vid) == drv["leaked_vidmem_objects"] == 12
            assert sum(o["size"] for o in vid) == drv["leaked_vidmem_bytes"]
            assert st.gpus[0]["used"] == drv["leaked_vidmem_bytes"]
            assert len(st.uvm_ranges) == 12
            proc.stdin.close()
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        st = wait_state(dev, lambda s: s.scalars.get("clients") == 0)
        assert st.gpus[0]["used"] == 0  # closing the fds freed the client's tree


@pytest.mark.live  # needs the FUSE stand-in: CI fails when it skips
@pytest.mark.skipif(FUSE_SKIP is not None, reason=FUSE_SKIP or "")
def test_over_budget_fails_in_the_driver(tmp_path: Path) -> None:
    with mounted_driver(tmp_path, budget=64 * MIB) as dev:
        r = run_workload("--quiet", devdir=dev, log=True,
                         env={"GPUTRACE_STANDIN_CUDA_MAX": "2T"})
        assert r.returncode == 0, r.stderr
        s = driver_summary(parse_driver_log(r.stderr))
        assert s["rm_alloc_failed"] == [("0x40", 1 << 40, 0x51)]
        st = wait_state(dev, lambda s: s.scalars.get("clients") == 0)
        assert st.gpus[0]["failed"] == 1


@pytest.mark.live  # needs the FUSE stand-in: CI fails when it skips
@pytest.mark.skipif(FUSE_SKIP is not None, reason=FUSE_SKIP or "")
def test_budget_too_small_gives_out_of_memory(tmp_path: Path) -> None:
    with mounted_driver(tmp_path, budget=8 * MIB) as dev:
        r = run_workload("--quiet", devdir=dev)
        assert r.returncode == 1
        assert "returned 2, expected 0" in r.stderr  # CUDA_ERROR_OUT_OF_MEMORY from RM
