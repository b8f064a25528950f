"""The HTML report's active-memory timeline: live bytes per allocation site at each
bucket end, from the allocator layer (the real H200 snapshot) or the API layer (the
torch_caching scenario, planted truth in fixtures/scenarios/build.py)."""

from __future__ import annotations

from pathlib import Path

from gputrace.analyses.helpers.inputs import inputs_from_trace
from gputrace.analyses.timeseries.active_memory import OTHER, active_memory
from gputrace.importers.torch_snapshot import read_snapshot, write_alone
from gputrace.render.html_plots import active_memory as figure
from gputrace.trace.builder import MiB
from gputrace.trace.reader import open_trace
from tests.analyze_helpers import SCENARIO_DIR
from tests.conftest import ROOT

REAL = ROOT / "fixtures" / "real-h200-torch" / "torch-workload.snapshot.pickle.xz"
LINE64 = "main (/work/steering/gpukit/workloads/torch_workload.py:64)"


def test_api_layer_sites_exact() -> None:
    """torch_caching in 11 buckets of 1 s: PyTorch's segments climb 30 MiB a second to
    270 MiB, the program's kept tensors 16 MiB a second to 160 MiB, cuBLAS's workspace
    is 64 MiB from the start; three sites, no `other`."""
    a = active_memory(inputs_from_trace(open_trace(SCENARIO_DIR / "torch_caching")),
                      buckets=11)
    assert a["source"] == "api" and a["t_s"] == [float(i) for i in range(1, 12)]
    got = {b["site"]: (b["peak"], b["values"]) for b in a["bands"]}
    # sites in the user's terms: the program's own line, else the CUDA call the
    # libraries made (PyTorch's allocator calls cudaMalloc, cuBLAS cublasLtMatmul)
    seg, keep, blas = ("pid 3000: cudaMalloc", "pid 3000: cudaMalloc < keep_tensor",
                       "pid 3000: cublasLtMatmul")
    assert [b["site"] for b in a["bands"]] == [seg, keep, blas]
    assert got[seg] == (270 * MiB, [30 * MiB * min(i, 9) for i in range(1, 12)])
    assert got[keep] == (160 * MiB, [16 * MiB * min(i, 10) for i in range(1, 12)])
    assert got[blas] == (64 * MiB, [64 * MiB] * 11)
    # the hover holds the full stack
    assert a["bands"][0]["frames"].startswith(
        "cudaMalloc < c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc")
    assert [d["device"] for d in a["devices"]] == [None]


def test_top_sites_and_other() -> None:
    """With top=1 the two smaller sites are summed as `other`."""
    a = active_memory(inputs_from_trace(open_trace(SCENARIO_DIR / "torch_caching")),
                      buckets=11, top=1)
    assert [b["site"] for b in a["bands"]][1:] == [OTHER]
    assert a["bands"][1]["values"][-1] == 160 * MiB + 64 * MiB


def test_real_snapshot_timeline(tmp_path: Path) -> None:
    """The real H200 snapshot (complete history): at the end of the trace the bands hold
    the 11 active blocks, 201,326,592 bytes; the largest band is line 64's 10 x 16 MiB."""
    out = write_alone(read_snapshot(REAL), tmp_path / "t")
    a = active_memory(inputs_from_trace(open_trace(out)))
    assert a["source"] == "allocator"
    assert sum(b["values"][-1] for b in a["bands"]) == 201_326_592
    top = max(a["bands"], key=lambda b: b["values"][-1])
    # the site is the user's line, file by its base name; the hover has the full path
    assert top["site"] == "main (torch_workload.py:64)" and top["values"][-1] == 160 * MiB
    assert top["frames"].startswith(LINE64)
    assert [d["device"] for d in a["devices"]] == [0]


def test_figure_escapes_site_names() -> None:
    """A site is trace text: the figure carries it escaped, in the legend and the hover."""
    s = {"recorded": True, "source": "api", "t_s": [1.0],
         "bands": [{"site": "pid 1: <img src=x onerror=alert(1)>", "peak": 1, "values": [1]}]}
    fig = figure(s)
    assert fig is not None
    trace = fig["data"][0]
    assert "<" not in trace["name"] and not any("<" in m for m in trace["meta"])
    assert figure({"recorded": True, "source": "api", "t_s": [], "bands": []}) is None
