"""Sites in the user's terms (helpers/sites.py): the first frame of the user's own
code, after the CUDA call it made; unwinder, interpreter, dispatcher, torch, installed
packages, the standard library and system libraries skipped; two sites never share
a label. On a C++-stack snapshot built beside the test (tests/cpp_snapshot.py, its
truth written there), the real H200 CUDA trace (fixtures/real-h200-cuda: the workload
calls cudaMalloc, cudaMallocHost, cudaMallocManaged and cudaMallocAsync from main,
and cuMemAlloc directly) and hand-made stacks."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from gputrace.analyses.helpers.inputs import inputs_from_trace
from gputrace.analyses.helpers.sites import (
    STATIC_CUDART,
    SiteFilter,
    allocator_sites,
    recorded_sites,
)
from gputrace.importers.torch_snapshot import read_snapshot, write_alone
from gputrace.schema import STACKS
from gputrace.trace.reader import open_trace
from tests import cpp_snapshot
from tests.conftest import ROOT

LIBRARY_WORDS = ("unwind", "CapturedTraceback", "c10::", "at::", "_PyEval", "PyObject",
                 "site-packages", "threading.py", "__libc_start_main")


@pytest.fixture(scope="module")
def cpp_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("cpp")
    pickle_path = cpp_snapshot.write(tmp / "snap.pickle")
    return write_alone(read_snapshot(pickle_path), tmp / "t")


def _allocator_sites(trace: Path, site_filter: SiteFilter | None = None) -> dict[int, str]:
    inp = inputs_from_trace(open_trace(trace))
    got = allocator_sites(inp.scan("allocator_frames"), site_filter).collect()
    return dict(zip(got["stack_id"], got["site"], strict=True))


def test_cpp_snapshot_sites_are_the_users_lines(cpp_trace: Path) -> None:
    sites = _allocator_sites(cpp_trace)
    assert sorted(sites.values()) == sorted(cpp_snapshot.SITES)
    for label in sites.values():
        assert not any(w in label for w in LIBRARY_WORDS), label


def test_site_filter_names_a_package_as_the_users(cpp_trace: Path) -> None:
    """A user whose code is diffusers: its frame is the site, and only frames under
    the filter count as the user's (the others fall back to the library's name)."""
    sites = set(_allocator_sites(cpp_trace, SiteFilter.parse("*/site-packages/diffusers/*"))
                .values())
    assert "__call__ (pipeline_utils.py:880)" in sites
    assert "run (pipeline.py:9)" not in sites
    prefix = _allocator_sites(cpp_trace, SiteFilter.parse("/home/u/proj/b/"))
    assert "forward (/home/u/proj/b/model.py:42)" in prefix.values()
    assert len(set(prefix.values())) == len(prefix)


@pytest.mark.parametrize("bad", ["", "   ", "a\x1b[2J", "x" * 5000])
def test_site_filter_refuses_what_is_not_a_path(bad: str) -> None:
    with pytest.raises(ValueError, match="--site-filter"):
        SiteFilter.parse(bad)


def test_real_h200_static_runtime_folded() -> None:
    """The statically linked runtime's hashed symbols read as one frame, and each site
    is the CUDA call and `main`, as the workload's source has it."""
    inp = inputs_from_trace(open_trace(ROOT / "fixtures" / "real-h200-cuda"))
    got = recorded_sites(inp.scan("stacks")).collect()
    assert set(got["site"]) == {"cudaMalloc < main", "cudaMallocHost < main",
                                "cudaMallocManaged < main", "cudaMallocAsync < main", "main"}
    for frames in got["frames"]:
        assert "libcudart_static_" not in frames
        assert frames.count(STATIC_CUDART) <= 1
    raw = inp.scan("stacks").filter(pl.col("symbol").str.starts_with("libcudart_static_"))
    assert raw.collect().height > 0  # the fixture does hold the hashes


def _native(stack_id: int, frames: list[tuple[str | None, str]]) -> list[dict[str, object]]:
    return [{"pid": 1, "stack_id": stack_id, "depth": d, "ip": 0x1000 + d, "module": m,
             "offset": 0x10 * d, "symbol": s, "kind": "native"}
            for d, (s, m) in enumerate(frames)]


def test_two_sites_never_share_a_label() -> None:
    """`main` of two programs with the same file name: the module's name does not tell
    them apart, so a number does; the same site from two stacks is one label."""
    libc = ("__libc_start_main", "/usr/lib/x86_64-linux-gnu/libc.so.6")
    rows = (_native(1, [("cuMemAlloc_v2", "/usr/lib/libcuda.so.1"), ("main", "/a/app"), libc])
            + _native(2, [("cuMemAlloc_v2", "/usr/lib/libcuda.so.1"), ("main", "/b/app"), libc])
            + _native(3, [("cuMemAlloc_v2", "/usr/lib/libcuda.so.1"), ("main", "/a/app"),
                          ("__libc_start_call_main", "/usr/lib/x86_64-linux-gnu/libc.so.6")]))
    got = recorded_sites(pl.DataFrame(rows, schema=STACKS.polars_schema).lazy()).collect()
    sites = dict(zip(got["stack_id"], got["site"], strict=True))
    assert sites[1] == sites[3] != sites[2]
    assert {sites[1], sites[2]} == {"cuMemAlloc_v2 < main (app) #1",
                                    "cuMemAlloc_v2 < main (app) #2"}


def test_mangled_cxx_frames_are_the_dispatchers() -> None:
    """Symbol tables hold C++ names mangled (`_ZN3c10…`, `_ZNSt…`): they are PyTorch's and
    the standard library's, never the user's, wherever the library lives."""
    rows = _native(1, [("cudaMalloc", "/x/site-packages/nvidia/lib/libcudart.so.13"),
                       ("_ZN3c104cuda20CUDACachingAllocator6Native22DeviceCachingAllocator"
                        "6mallocEmP11CUstream_st", "/opt/app/libc10_cuda_custom.so"),
                       ("_ZNSt8functionIFvvEEclEv", "/opt/app/libstuff.so"),
                       ("run_model", "/opt/app/bin/serve")])
    got = recorded_sites(pl.DataFrame(rows, schema=STACKS.polars_schema).lazy()).collect()
    assert got["site"].to_list() == ["cudaMalloc < run_model"]
