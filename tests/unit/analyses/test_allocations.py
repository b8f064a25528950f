"""The joined allocations model and the leak view reading it: each piece of memory told
once, on the real H200 trace (TRUTH.json), the recorded stand-in (EXPECTED.json) and
synthetic builder traces (each join rule alone)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from gputrace.analyses.helpers.inputs import inputs_from_trace
from gputrace.analyses.helpers.lifetimes import lifetimes, memory
from gputrace.analyses.helpers.partition import Slice
from gputrace.render.terminal import render_terminal
from gputrace.trace.builder import MiB, TraceBuilder
from gputrace.trace.reader import open_trace
from tests.analyze_helpers import analyze
from tests.conftest import FIXTURES

REAL = FIXTURES / "real-h200-cuda"
STANDIN = FIXTURES / "standin-cuda"


@pytest.fixture(scope="module")
def real() -> dict[str, Any]:
    return analyze(REAL, ["leaks"])["leaks"]


@pytest.fixture(scope="module")
def standin() -> dict[str, Any]:
    return analyze(STANDIN, ["leaks"])["leaks"]


def model(path: Path) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """(memory lifetimes, linked rows, pieces) of a trace."""
    sl = Slice(inputs_from_trace(open_trace(path)))
    r, pieces = sl.model()
    return memory(lifetimes(sl.inp)).collect(), r, pieces


# ---------------------------------------------------------------- real H200 trace
def test_real_headline_is_the_programs_api_leak(real: dict[str, Any]) -> None:
    """TRUTH.json: 6 API allocations leaked, expected_leak_bytes 72,351,744 (69 MiB)."""
    assert (real["total_bytes"], real["total_count"], real["total_basis"]) == (
        72_351_744, 6, "api")
    assert {r["class"] for r in real["leaked"]} == {"api"}
    assert sum(r["bytes"] for r in real["leaked"]) == 72_351_744


def test_real_context_memory_is_released_by_the_driver_at_exit(real: dict[str, Any]) -> None:
    held = real["driver_held"]
    assert set(held["by_kind"]) == {"unfreed_at_exit"}
    # the context's 414 MiB + 70 MiB vidmem and 56 MiB sysmem are among it
    assert held["bytes"] >= (414 + 70 + 56) * MiB and held["count"] > 20
    assert real["total_bytes"] < held["bytes"]


def test_real_reservations_are_not_memory_and_nothing_grows(real: dict[str, Any]) -> None:
    assert real["reservations"]["uvm-virtual"]["bytes"] > 280 * 1024 * MiB
    assert "rm-virtual" in real["reservations"]
    assert real["growing_pids"] == []
    assert not any(g["flagged"] for g in real["growth"])
    # the 280 GiB pool reservation is no longer UVM memory
    assert max(g["peak_bytes"] for g in real["growth"] if g["layer"] == "uvm") < 1024 * MiB


def test_real_leak_rows_carry_stacks(real: dict[str, Any]) -> None:
    assert all(r["frames"] and "main" in r["frames"] for r in real["leaked"])
    sites = {(s["count"], s["size_bytes"]): s for s in real["leak_sites"]}
    one_mib = sites[(5, MiB)]
    assert "cudaMalloc" in one_mib["frames"]
    assert (one_mib["backing_count"], one_mib["backing_size_bytes"]) == (3, 2 * MiB)
    assert sites[(1, 64 * MiB)]["backing_size_bytes"] == 64 * MiB


# ---------------------------------------------------------------- recorded stand-in
def test_standin_one_site_23_leaks_in_12_driver_allocations(standin: dict[str, Any]) -> None:
    """EXPECTED.json: 23 cuMemAlloc of 1 MiB from leak_buffers never freed; the stand-in
    sub-allocates them from 2 MiB RM allocations."""
    assert (standin["total_bytes"], standin["total_count"]) == (23 * MiB, 23)
    (site,) = standin["leak_sites"]
    assert site["frames"].startswith("leak_buffers < main")
    assert (site["count"], site["size_bytes"], site["bytes"]) == (23, MiB, 23 * MiB)
    assert (site["backing_count"], site["backing_size_bytes"], site["backing_bytes"]) == (
        12, 2 * MiB, 24 * MiB)
    # 12 pieces, 11 of them identical (two 1 MiB allocations in a 2 MiB object): two
    # rows, each with its count, not 12 identical rows
    assert [(r["pieces"], r["api_count"], r["size_bytes"], r["bytes"], r["rm_bytes"])
            for r in standin["leaked"]] == [(11, 22, 2 * MiB, 22 * MiB, 22 * MiB),
                                            (1, 1, MiB, MiB, 2 * MiB)]
    assert len(standin["leaked"][0]["api_ids"]) == 22


def test_standin_terminal_explains_the_difference() -> None:
    buf = io.StringIO()
    render_terminal(analyze(STANDIN, ["leaks"]), buf, color=False)
    text = buf.getvalue()
    assert "leaked: 23.0 MiB (24,117,248 bytes of API allocations) in 23 allocations" in text
    assert "23 \N{MULTIPLICATION SIGN} 1.0 MiB API allocations inside 12 \N{MULTIPLICATION SIGN}" \
           " 2.0 MiB driver" in text
    layered = io.StringIO()
    render_terminal(analyze(STANDIN, ["leaks"]), layered, color=False, by_layer=True)
    assert "by layer (one allocation may appear in each layer): api 23.0 MiB, rm 24.0 MiB, " \
           "uvm 24.0 MiB" in layered.getvalue()


@pytest.mark.parametrize("path", [REAL, STANDIN, FIXTURES / "standin-rm",
                                  FIXTURES / "default"], ids=lambda p: p.name)
def test_every_lifetime_row_is_in_exactly_one_piece(path: Path) -> None:
    lt, r, pieces = model(path)
    assert r.height == lt.height and r["_row"].n_unique() == r.height
    assert set(r["piece"]) == set(pieces["piece"])
    for layer, (n, b) in {"api": ("api_count", "api_bytes"), "rm": ("rm_count", "rm_bytes"),
                          "uvm": ("uvm_count", "uvm_bytes")}.items():
        mine = lt.filter(pl.col("layer") == layer)
        assert int(pieces[n].sum()) == mine.height
        assert int(pieces[b].sum() or 0) == int(mine["size_bytes"].sum() or 0)
    assert pieces.filter(pl.col("rm_count") > 1).is_empty()  # one RM object per piece


def test_syscall_only_trace_reports_driver_allocations() -> None:
    lk = analyze(FIXTURES / "standin-rm", ["leaks"])["leaks"]
    assert lk["total_basis"] == "driver" and lk["driver_held"] is None
    assert {r["class"] for r in lk["leaked"]} <= {"unattributed"}
    assert lk["total_bytes"] == sum(r["bytes"] for r in lk["leaked"])


# ------------------------------------------------------------ join rules (synthetic)
def _trace(tmp_path: Path, build: Any) -> dict[str, Any]:
    b = TraceBuilder(layers=("syscall", "api"), duration_s=2.0)
    b.process(50, "prog")
    build(b)
    return analyze(b.build(tmp_path / "t"), ["leaks"])["leaks"]


def test_rm_made_inside_the_call_window_backs_the_call(tmp_path: Path) -> None:
    """synthetic: an RM object made 1 us into a 10 us cuMemAlloc on the same thread is
    its backing; one made on another thread, or after the call returned, is not."""
    def build(b: TraceBuilder) -> None:
        b.cuda_alloc(1.0, 50, 3 * MiB, stack=["f", "main"])
        b.rm_alloc(1.0 + 1e-6, 50, size=4 * MiB)
        b.cuda_alloc(1.2, 50, 5 * MiB, stack=["g", "main"])
        b.rm_alloc(1.2 + 1e-6, 50, size=6 * MiB)
        b.rows["ioctls"][-1]["tid"] = 51
        b.rm_alloc(1.3, 50, size=8 * MiB)

    lk = _trace(tmp_path, build)
    assert lk["total_bytes"] == 8 * MiB  # the API bytes, nothing counted twice
    by_size = {r["bytes"]: r for r in lk["leaked"]}
    assert by_size[3 * MiB]["rm_bytes"] == 4 * MiB
    assert by_size[5 * MiB]["rm_bytes"] == 0
    assert lk["driver_held"]["bytes"] == 14 * MiB and lk["driver_held"]["count"] == 2


def test_sub_allocations_join_through_the_mapping(tmp_path: Path) -> None:
    """synthetic: the second 1 MiB pointer lies in the 2 MiB page the first call mapped
    (UVM_MAP_EXTERNAL_ALLOCATION of the RM handle): one piece, two API children."""
    base = 0x7F0000000000

    def build(b: TraceBuilder) -> None:
        b.cuda_alloc(1.0, 50, MiB, ptr=base, stack=["leak", "main"])
        h = b.rm_alloc(1.0 + 1e-6, 50, size=2 * MiB)
        b.uvm(1.0 + 2e-6, 50, "UVM_CREATE_EXTERNAL_RANGE", base=base, length=2 * MiB)
        b.uvm(1.0 + 3e-6, 50, "UVM_MAP_EXTERNAL_ALLOCATION", base=base, length=2 * MiB,
              h_object=h)
        b.cuda_alloc(1.1, 50, MiB, ptr=base + MiB, stack=["leak", "main"])

    lk = _trace(tmp_path, build)
    (row,) = lk["leaked"]
    assert (row["api_count"], row["bytes"], row["rm_bytes"], row["uvm_bytes"]) == (
        2, 2 * MiB, 2 * MiB, 2 * MiB)
    (site,) = lk["leak_sites"]
    assert (site["count"], site["backing_count"], site["frames"]) == (2, 1, "leak < main")
    assert lk["reservations"] == {"uvm-virtual": {"count": 1, "bytes": 2 * MiB}}


def test_short_rise_is_not_growth(tmp_path: Path) -> None:
    """synthetic: 10 allocations of 4 MiB in 1 s climb steadily but are too short to be
    called growing (MIN_DURATION_S)."""
    def build(b: TraceBuilder) -> None:
        for i in range(10):
            b.cuda_alloc(0.5 + 0.1 * i, 50, 4 * MiB)

    lk = _trace(tmp_path, build)
    (g,) = lk["growth"]
    assert g["rising_troughs"] >= 4 and g["slope_bytes_per_min"] > 0
    assert not g["flagged"] and lk["growing_pids"] == []


def test_cli_by_layer_shows_each_layer(tmp_path: Path) -> None:
    from tests.cli_helpers import cli

    def run(*extra: str) -> str:
        r = cli("analyze", str(STANDIN), "--only", "leaks", *extra)
        assert r.returncode == 0, r.stderr
        return r.stdout

    joined, layered = run(), run("--by-layer")
    assert "Leak sites" in joined and "Leaked allocations" not in joined
    assert "Leaked allocations" in layered and "Leak sites" not in layered
    assert "api 23.0 MiB, rm 24.0 MiB, uvm 24.0 MiB" in layered
