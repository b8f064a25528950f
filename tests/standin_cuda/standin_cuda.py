"""TEST STAND-IN helpers: build and run the stand-in libcuda and its known workload.

Not NVIDIA code. ``build/libcuda.so.1`` exports the CUDA driver API allocation calls
with the real signatures and forwards them to the FUSE stand-in driver of
``tests/standin`` (when ``GPUTRACE_STANDIN_DEVDIR`` names its mount) the way the real
libcuda talks to the driver. ``build/cuda_workload`` calls it from known functions;
``expected.json`` (``cuda_workload --print-expected``) lists what it calls. See README.md.

Typical use::

    from tests.standin_cuda.standin_cuda import build, run_workload

    paths = build()
    r = run_workload("--quiet")                       # bookkeeping only, no driver
    with mounted_driver(tmp_path, budget=256 << 20) as dev:   # tests.standin.standin
        r = run_workload("--quiet", devdir=dev)       # RM/UVM ioctls on the FUSE driver
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from tests.standin.standin import (
    WaitingWorkload,
    locked_make,
    print_expected,
    started_waiting,
)

HERE = Path(__file__).resolve().parent
BUILD_DIR = HERE / "build"
EXPECTED_JSON = HERE / "expected.json"

#: Every symbol the API layer probes, plus the calls the workload needs around them.
REQUIRED_SYMBOLS: tuple[str, ...] = (
    "cuInit",
    "cuDeviceGet",
    "cuCtxCreate_v2",
    "cuCtxDestroy_v2",
    "cuMemAlloc_v2",
    "cuMemAllocPitch_v2",
    "cuMemFree_v2",
    "cuMemAllocManaged",
    "cuMemAllocHost_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemAllocAsync",
    "cuMemAllocFromPoolAsync",
    "cuMemFreeAsync",
    "cuMemAllocAsync_ptsz",
    "cuMemAllocFromPoolAsync_ptsz",
    "cuMemFreeAsync_ptsz",
)
#: Also exported (used by the workload, not probed).
EXTRA_SYMBOLS: tuple[str, ...] = (
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuCtxSynchronize",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamSynchronize_ptsz",
    "cuMemGetAllocationGranularity",
    "cuMemSetAccess",
    "cuDeviceGetDefaultMemPool",
)


class StandinCudaUnavailable(RuntimeError):
    """gcc or make is missing, or the build failed."""


class Paths(NamedTuple):
    lib_dir: Path
    libcuda: Path
    workload: Path

    @property
    def workload_dlopen(self) -> Path:
        """The --dlopen twin: no DT_NEEDED on libcuda, dlopen()s it after READY."""
        return self.lib_dir / "cuda_workload_dlopen"


def skip_reason() -> str | None:
    for tool in ("gcc", "make"):
        if shutil.which(tool) is None:
            return f"{tool} not found (apt-get install build-essential)"
    return None


def build() -> Paths:
    """Run make in tests/standin_cuda; return (lib dir, libcuda.so.1, cuda_workload)."""
    problem = skip_reason()
    if problem:
        raise StandinCudaUnavailable(problem)
    r = locked_make(HERE, [])
    if r is not None and r.returncode != 0:
        raise StandinCudaUnavailable(f"building the CUDA stand-in failed:\n{r.stdout}{r.stderr}")
    return Paths(lib_dir=BUILD_DIR, libcuda=BUILD_DIR / "libcuda.so.1",
                 workload=BUILD_DIR / "cuda_workload")


def link_program(source: Path, exe: Path) -> Path:
    """gcc -O2 `source` (a C program calling cuMem*) against the stand-in libcuda, frame
    pointers kept so stacks walk to main; returns `exe`."""
    lib = build().lib_dir
    subprocess.run(["gcc", "-O2", "-fno-omit-frame-pointer", f"-I{HERE}", "-o", str(exe),
                    str(source), f"-L{lib}", "-l:libcuda.so.1", f"-Wl,-rpath,{lib}"],
                   check=True)  # fmt: skip
    return exe


def workload_env(devdir: Path | str | None = None, log: bool = False,
                 extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for the workload: GPUTRACE_STANDIN_DEVDIR set or removed."""
    env = dict(os.environ)
    env.pop("GPUTRACE_STANDIN_DEVDIR", None)
    if devdir is not None:
        env["GPUTRACE_STANDIN_DEVDIR"] = str(devdir)
    if log:
        env["GPUTRACE_STANDIN_CUDA_LOG"] = "1"
    if extra:
        env.update(extra)
    return env


def run_workload(*args: str, devdir: Path | str | None = None, log: bool = False,
                 env: Mapping[str, str] | None = None, timeout: float = 60.0,
                 check: bool = False) -> subprocess.CompletedProcess[str]:
    """Run cuda_workload with args. devdir: a mounted FUSE stand-in (None: no driver).

    log=True sets GPUTRACE_STANDIN_CUDA_LOG=1 (driver operations on stderr, see
    parse_driver_log). ``--dlopen`` runs the dlopen twin (same pid via exec).
    """
    paths = build()
    return subprocess.run([str(paths.workload), *args], capture_output=True, text=True,
                          timeout=timeout, check=check,
                          env=workload_env(devdir, log, env))


@contextlib.contextmanager
def waiting_workload(*args: str, devdir: Path | str | None = None, dlopen: bool = False,
                     log: bool = False, env: Mapping[str, str] | None = None,
                     timeout: float = 30.0) -> Iterator[WaitingWorkload]:
    """Start ``cuda_workload --wait ...`` and yield once it printed ``READY <pid>``.

    dlopen=True starts the twin that has never mapped libcuda at that point.
    """
    paths = build()
    exe = paths.workload_dlopen if dlopen else paths.workload
    with started_waiting([str(exe), "--wait", *args], env=workload_env(devdir, log, env),
                         timeout=timeout) as w:
        yield w


def expected() -> dict[str, Any]:
    """``cuda_workload --print-expected``, parsed."""
    return print_expected(build().workload)


def load_expected_json() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(EXPECTED_JSON.read_text())
    return data


# --------------------------------------------------------------- output parsing

_CALL = re.compile(r"^CALL (\S+) (\S+) size=(\d+) result=(-?\d+) ptr=0x([0-9a-f]+)$")
_DRV = re.compile(r"^standin-cuda: drv (\S+)(.*)$")


@dataclass(frozen=True)
class Call:
    function: str
    symbol: str
    size: int
    result: int
    ptr: int


def parse_calls(stdout: str) -> list[Call]:
    """The workload's ``CALL <function> <symbol> size= result= ptr=`` lines."""
    out = []
    for line in stdout.splitlines():
        m = _CALL.match(line)
        if m:
            out.append(Call(m[1], m[2], int(m[3]), int(m[4]), int(m[5], 16)))
    return out


@dataclass
class DriverOp:
    op: str
    fields: dict[str, str] = field(default_factory=dict)

    def num(self, key: str) -> int:
        return int(self.fields[key], 0)


def parse_driver_log(stderr: str) -> list[DriverOp]:
    """The ``standin-cuda: drv OP key=value ...`` lines (GPUTRACE_STANDIN_CUDA_LOG=1)."""
    ops = []
    for line in stderr.splitlines():
        m = _DRV.match(line)
        if m:
            kv = dict(w.split("=", 1) for w in m[2].split() if "=" in w)
            ops.append(DriverOp(m[1], kv))
    return ops


def driver_summary(ops: list[DriverOp]) -> dict[str, Any]:
    """Counts in the shape of expected.json's "driver" section (for comparison)."""
    rm_alloc = [o for o in ops if o.op == "RM_ALLOC"]
    by_class = Counter(hex(o.num("class")) for o in rm_alloc if o.num("status") == 0)
    uvm = Counter(o.op for o in ops if o.op.startswith("UVM_"))
    vid_handles = {o.fields["handle"] for o in rm_alloc if o.num("class") == 0x40}
    return {
        "rm_alloc_by_class": dict(by_class),
        "rm_alloc_vidmem_sizes": [o.num("size") for o in rm_alloc
                                  if o.num("class") == 0x40 and o.num("status") == 0],
        "rm_alloc_failed": [(hex(o.num("class")), o.num("size"), o.num("status"))
                            for o in rm_alloc if o.num("status") != 0],
        "rm_alloc_memory_sizes": [o.num("size") for o in ops if o.op == "RM_ALLOC_MEMORY"],
        "rm_free_vidmem": sum(1 for o in ops
                              if o.op == "RM_FREE" and o.fields["handle"] in vid_handles),
        "rm_free_total": sum(1 for o in ops if o.op == "RM_FREE"),
        "uvm": dict(uvm),
        "managed_mmaps": [o.num("length") for o in ops if o.op == "MMAP_UVM"],
        "managed_munmaps": sum(1 for o in ops if o.op == "MUNMAP_UVM"),
        "statuses": sorted({o.fields["status"] for o in ops if "status" in o.fields}),
    }
