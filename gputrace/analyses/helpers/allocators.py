"""Which library made an allocation: a caching allocator that keeps memory by design,
or the program itself?

ONE table maps library file names to the allocator they hold (`ALLOCATORS`); an
API allocation is classed from the native frames of its stack (the stacks table,
innermost first) by the first frame, innermost outward, whose module matches.
The innermost match wins because the library closest to the CUDA call is the one
that asked for the memory: PyTorch calling cuBLAS calling cudaMalloc is cuBLAS's
workspace, while cuBLAS asking PyTorch's allocator for its workspace lands in
libc10_cuda first and is a PyTorch block. libcuda and libcudart are the API itself
(every allocation passes through them), so they never class an allocation; the
CUDA context and runtime's own memory is the leak report's `driver_held`.
A stack that matches nothing, or no stack, is the program's (`program`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import polars as pl

__all__ = ["ALLOCATORS", "CACHED", "PROGRAM", "Allocator", "allocator_of", "stack_allocators"]


@dataclass(frozen=True)
class Allocator:
    """A library that allocates GPU memory; `cached` when it keeps memory by design
    (freed at exit, not a leak)."""

    name: str
    label: str
    cached: bool
    pattern: str  # regex searched in the module's path


# File names as the wheels and toolkits install them (lib<name>.so[.<version>]);
# RMM's Python extensions live in an `rmm/` package directory.
ALLOCATORS: tuple[Allocator, ...] = (
    Allocator("pytorch", "PyTorch's caching allocator", True, r"(^|/)libc10_cuda\.so"),
    Allocator("cublas", "cuBLAS workspace", True, r"(^|/)libcublas(Lt)?\.so"),
    Allocator("nccl", "NCCL", False, r"(^|/)libnccl\.so"),
    Allocator("cudnn", "cuDNN", False, r"(^|/)libcudnn(_[a-z_]+)?\.so"),
    Allocator("xla", "JAX/XLA's BFC allocator", True,
              r"(^|/)(xla_extension|libtensorflow_framework|libjax_common)[.\w-]*\.so"),
    Allocator("rmm", "RAPIDS RMM pool", True, r"(^|/)librmm\.so|/rmm/(.*/)?[^/]*\.so"),
)
PROGRAM = "program"
CACHED = [a.name for a in ALLOCATORS if a.cached]
"""Allocators whose unfreed memory is held by design, never a leak."""


def allocator_of(module: str | None) -> Allocator | None:
    """The allocator whose library `module` (a path) is, or None."""
    if not module:
        return None
    return next((a for a in ALLOCATORS if re.search(a.pattern, module)), None)


def stack_allocators(stacks: pl.LazyFrame) -> pl.LazyFrame:
    """(pid, stack_id, allocator, allocator_depth): the allocator of each stack, from
    its innermost matching frame (stacks without a match are absent: the program's)."""
    base = pl.col("module").fill_null("")
    name = pl.lit(None, pl.String)
    for a in reversed(ALLOCATORS):
        name = pl.when(base.str.contains(a.pattern)).then(pl.lit(a.name)).otherwise(name)
    return (stacks.select("pid", "stack_id", "depth", allocator=name)
            .filter(pl.col("allocator").is_not_null())
            .sort("pid", "stack_id", "depth")
            .group_by("pid", "stack_id").agg(pl.col("allocator").first(),
                                             pl.col("depth").first().alias("allocator_depth")))
