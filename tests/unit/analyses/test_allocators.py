"""Allocators known by name: the library-pattern table on real install paths, and the
leak report of the torch_caching scenario (planted truth in its docstring in
fixtures/scenarios/build.py): 10 x 16 MiB leaked by the program, 9 segments 270 MiB
held by PyTorch's caching allocator, a 64 MiB cuBLAS workspace."""

from __future__ import annotations

from typing import Any

import polars as pl
import pytest

from gputrace.analyses.helpers.allocators import allocator_of, stack_allocators
from gputrace.analyses.helpers.inputs import inputs_from_trace
from gputrace.analyses.timeseries.stacks_by_bytes import folded_stacks
from gputrace.trace.builder import MiB
from gputrace.trace.reader import open_trace
from tests.analyze_helpers import SCENARIO_DIR, analyze

SITE = "/usr/local/lib/python3.11/site-packages/"


@pytest.mark.parametrize(("path", "name"), [
    (SITE + "torch/lib/libc10_cuda.so", "pytorch"),
    (SITE + "nvidia/cublas/lib/libcublasLt.so.12", "cublas"),
    (SITE + "nvidia/cublas/lib/libcublas.so.12", "cublas"),
    (SITE + "nvidia/nccl/lib/libnccl.so.2", "nccl"),
    (SITE + "nvidia/cudnn/lib/libcudnn_ops.so.9", "cudnn"),
    ("/usr/lib/x86_64-linux-gnu/libcudnn.so.8.9.7", "cudnn"),
    (SITE + "jaxlib/xla_extension.so", "xla"),
    (SITE + "tensorflow/libtensorflow_framework.so.2", "xla"),
    ("/opt/conda/lib/librmm.so", "rmm"),
    (SITE + "rmm/_lib/memory_resource.cpython-311-x86_64-linux-gnu.so", "rmm"),
    (SITE + "nvidia/cuda_runtime/lib/libcudart.so.12", None),
    ("/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04", None),
    (SITE + "torch/lib/libc10.so", None),
    (SITE + "torch/lib/libtorch_cuda.so", None),
    ("/usr/bin/python3.11", None),
    (None, None),
])
def test_library_paths_name_their_allocator(path: str | None, name: str | None) -> None:
    a = allocator_of(path)
    assert (a.name if a else None) == name


def test_innermost_matching_frame_wins() -> None:
    """cuBLAS called by PyTorch (cudart < libcublasLt < libc10_cuda) is cuBLAS's; a
    stack with no known library is absent (the program's)."""
    rows = [(1, 1, 0, SITE + "nvidia/cuda_runtime/lib/libcudart.so.12"),
            (1, 1, 1, SITE + "nvidia/cublas/lib/libcublasLt.so.12"),
            (1, 1, 2, SITE + "torch/lib/libc10_cuda.so"),
            (1, 2, 0, SITE + "torch/lib/libc10_cuda.so"),
            (1, 3, 0, "/usr/bin/app")]
    stacks = pl.LazyFrame(rows, schema=["pid", "stack_id", "depth", "module"], orient="row")
    got = stack_allocators(stacks).sort("stack_id").collect()
    assert got.rows() == [(1, 1, "cublas", 1), (1, 2, "pytorch", 0)]


@pytest.fixture(scope="module")
def leaks() -> dict[str, Any]:
    doc: dict[str, Any] = analyze(SCENARIO_DIR / "torch_caching")["leaks"]
    return doc


def test_headline_counts_only_what_the_program_leaked(leaks: dict[str, Any]) -> None:
    assert (leaks["total_bytes"], leaks["total_count"]) == (160 * MiB, 10)
    [site] = leaks["leak_sites"]
    assert (site["count"], site["bytes"], site["frames"]) == (
        10, 160 * MiB, "cudaMalloc < keep_tensor < main")
    assert {(r["size_bytes"], r["pieces"]) for r in leaks["leaked"]} == {(16 * MiB, 10)}


def test_caching_allocators_hold_memory_by_design(leaks: dict[str, Any]) -> None:
    assert leaks["held_by_allocator"] == {
        "cublas": {"label": "cuBLAS workspace", "cached_by_design": True,
                   "count": 1, "bytes": 64 * MiB},
        "pytorch": {"label": "PyTorch's caching allocator", "cached_by_design": True,
                    "count": 9, "bytes": 270 * MiB},
    }


def test_growth_is_judged_per_allocator(leaks: dict[str, Any]) -> None:
    """PyTorch adds a 30 MiB segment a second (9 of them): growing, slope exactly
    30 MiB/s; the program leaks 16 MiB a second (binned troughs: within 2 %); the
    single cuBLAS workspace is not growth."""
    g = {r["allocator"]: r for r in leaks["growth_by_allocator"]}
    assert set(g) == {"cublas", "program", "pytorch"}
    assert g["pytorch"]["flagged"] and g["pytorch"]["slope_bytes_per_min"] == 30 * MiB * 60
    assert (g["pytorch"]["events"], g["pytorch"]["end_bytes"]) == (9, 270 * MiB)
    assert g["program"]["flagged"] and g["program"]["end_bytes"] == 160 * MiB
    assert g["program"]["slope_bytes_per_min"] == pytest.approx(16 * MiB * 60, rel=0.02)
    assert not g["cublas"]["flagged"] and g["cublas"]["end_bytes"] == 64 * MiB
    sites = [(s["allocator"], s["count"], s["bytes"], s["frames"].split(" < ")[1],
              s["trigger"]) for s in leaks["allocator_sites"]]
    assert sites == [
        ("pytorch", 9, 270 * MiB,
         "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc",
         "at::empty_cuda"),
        ("cublas", 1, 64 * MiB, "cublasLtMatmul", "at::cuda::blas::gemm")]


def test_folded_stacks_add_up_to_the_headline() -> None:
    """The leak icicle / `--format folded` rows leave out memory held by design: their
    sum is `total_bytes` (160 MiB, one stack), not the 494 MiB never freed."""
    inp = inputs_from_trace(open_trace(SCENARIO_DIR / "torch_caching"))
    rows = folded_stacks(inp)
    assert [(r["bytes"], r["frames"]) for r in rows] == [
        (160 * MiB, ["keep_tensor", "cudaMalloc"])]  # the interpreter's `main` left out
    assert sum(r["bytes"] for r in folded_stacks(inp, allocated=True)) == 494 * MiB


def test_plain_programs_have_no_allocator_held(tmp_path: Any) -> None:
    doc = analyze(SCENARIO_DIR / "training_leak")["leaks"]
    assert doc["held_by_allocator"] == {} and doc["allocator_sites"] == []
    assert [r["allocator"] for r in doc["growth_by_allocator"]] == ["program"]
