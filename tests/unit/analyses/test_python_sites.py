"""Python frames name the site: a caching allocator's new segment is triggered by the
innermost Python frame of its stack (not the native frame calling the allocator), and
the one-line stack of terminal tables leads with the program's innermost Python frame
when ctypes/libffi frames sit inside it (all frames stay in JSON `frames`). Planted: a
PyTorch-like program (pid 4000) whose `grow` (train.py:64) makes PyTorch add 3 x 30 MiB
segments and whose `keep` (train.py:70) leaks 2 x 16 MiB through ctypes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from gputrace.trace.builder import MiB, TraceBuilder
from tests.analyze_helpers import analyze

CUDART = ("cudaMalloc", "/opt/nvidia/cuda_runtime/lib/libcudart.so.13")
TORCH = "/opt/torch/lib/"
PY = "/usr/bin/python3.11"
FFI = "/usr/lib/x86_64-linux-gnu/libffi.so.8"
SEGMENT = [CUDART, ("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc",
                    TORCH + "libc10_cuda.so"), ("at::empty_cuda", TORCH + "libtorch_cuda.so"),
           ("grow", "/work/train.py", 64), ("main", "/work/train.py", 80), ("Py_RunMain", PY)]
NATIVE_SEGMENT = [CUDART, SEGMENT[1], ("at::empty_cuda", TORCH + "libtorch_cuda.so"),
                  ("_PyEval_EvalFrameDefault", PY)]
KEEP = [("cuMemAlloc_v2", "/usr/lib/libcuda.so.1"), ("ffi_call_unix64", FFI), ("ffi_call", FFI),
        ("_ctypes_callproc", "/usr/lib/python3.11/lib-dynload/_ctypes.so"),
        ("keep", "/work/train.py", 70), ("main", "/work/train.py", 81), ("Py_RunMain", PY)]


@pytest.fixture(scope="module")
def leaks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    b = TraceBuilder(layers=("syscall", "api"), duration_s=6.0)
    b.process(4000, "python3")
    for i in range(3):
        b.cuda_alloc(0.5 + i, 4000, 30 * MiB, stack=SEGMENT)
        if i < 2:
            b.cuda_alloc(0.7 + i, 4000, 16 * MiB, stack=KEEP)
    b.cuda_alloc(4.0, 4000, 30 * MiB, stack=NATIVE_SEGMENT)
    path: Path = b.build(tmp_path_factory.mktemp("py") / "trace")
    doc: dict[str, Any] = analyze(path, ["leaks"])["leaks"]
    return doc


def test_segment_trigger_is_the_innermost_python_frame(leaks: dict[str, Any]) -> None:
    """The Python stack names `grow (train.py:64)`; without Python frames the trigger
    stays the allocator's native caller."""
    got = sorted((s["count"], s["bytes"], s["trigger"]) for s in leaks["allocator_sites"])
    assert got == [(1, 30 * MiB, "at::empty_cuda"), (3, 90 * MiB, "grow (train.py:64)")]


def test_terminal_site_leads_with_python_frame(leaks: dict[str, Any]) -> None:
    [site] = leaks["leak_sites"]
    assert (site["count"], site["bytes"]) == (2, 32 * MiB)
    assert site["frames"] == ("cuMemAlloc_v2 < ffi_call_unix64 < ffi_call < _ctypes_callproc"
                              " < keep (train.py:70) < main (train.py:81) < Py_RunMain")
    # the site: the CUDA call and the first frame of the user's own code
    assert site["site"] == "cuMemAlloc_v2 < keep (train.py:70)"
    assert {r["site"] for r in leaks["leaked"]} == {site["site"]}


def test_terminal_table_shows_the_python_site(leaks: dict[str, Any]) -> None:
    from gputrace.render.leak_sections import leaks_section

    con = Console(width=120, record=True, color_system=None)
    leaks_section(con, leaks, 10)
    text = con.export_text()
    assert "cuMemAlloc_v2 < keep (train.py:70)" in text
    assert "ffi_call_unix64" not in text
