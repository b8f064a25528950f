"""Property (synthetic builder traces): the joined allocations model's per-layer totals
equal the per-layer lifetimes, and the leak headline counts no allocation twice."""

from __future__ import annotations

import tempfile
from pathlib import Path

import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gputrace.analyses.helpers.inputs import inputs_from_trace
from gputrace.analyses.helpers.lifetimes import lifetimes, memory
from gputrace.analyses.helpers.partition import Slice
from gputrace.trace.builder import MiB, TraceBuilder
from gputrace.trace.reader import open_trace
from tests.analyze_helpers import analyze

PIDS = (20, 21)
BASES = tuple(0x7F0000000000 + i * 8 * MiB for i in range(3))

# (pid, slot, API MiB, RM MiB made in the call (0: none), mapped?, second pointer in
# the same page?, free the API?, free the RM?, RM outside any call MiB (0: none))
op = st.tuples(st.sampled_from(PIDS), st.sampled_from(range(len(BASES))), st.integers(1, 4),
               st.sampled_from([0, 2, 4]), st.booleans(), st.booleans(), st.booleans(),
               st.booleans(), st.sampled_from([0, 1, 2]))


def build(ops: list[tuple[int, int, int, int, bool, bool, bool, bool, int]],
          exit_pid: bool) -> TraceBuilder:
    b = TraceBuilder(layers=("syscall", "api"), duration_s=1.0 + len(ops))
    b.process(20, "a", exit=0.5 + len(ops) if exit_pid else None)
    b.process(21, "b")
    live: set[tuple[int, int]] = set()
    for i, (pid, slot, api_mib, rm_mib, mapped, second, free_api, free_rm, ctx) in \
            enumerate(ops):
        t = 0.1 + i
        if (pid, slot) in live:
            continue  # a pointer is never handed out twice while live
        ptr = BASES[slot]
        b.cuda_alloc(t, pid, api_mib * MiB, ptr=ptr, stack=[f"site{slot}", "main"])
        h = None
        if rm_mib:
            h = b.rm_alloc(t + 1e-6, pid, size=rm_mib * MiB)
            if mapped:
                b.uvm(t + 2e-6, pid, "UVM_CREATE_EXTERNAL_RANGE", base=ptr,
                      length=rm_mib * MiB)
                b.uvm(t + 3e-6, pid, "UVM_MAP_EXTERNAL_ALLOCATION", base=ptr,
                      length=rm_mib * MiB, h_object=h)
        if second and api_mib < 2:
            b.cuda_alloc(t + 0.1, pid, MiB // 2, ptr=ptr + MiB, stack=["sub", "main"])
            if free_api:
                b.cuda_free(t + 0.35, pid, ptr + MiB)
        if ctx:
            b.rm_alloc(t + 0.2, pid, size=ctx * MiB)
        if free_api:
            b.cuda_free(t + 0.4, pid, ptr)
        else:
            live.add((pid, slot))
            continue
        if h is not None and free_rm:
            if mapped:
                b.uvm(t + 0.45, pid, "UVM_FREE", base=ptr)
            b.rm_free(t + 0.5, pid, handle=h)
    return b


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(op, min_size=1, max_size=12), st.booleans())
def test_model_totals_equal_lifetimes_and_headline_counts_once(
        ops: list[tuple[int, int, int, int, bool, bool, bool, bool, int]],
        exit_pid: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = build(ops, exit_pid).build(Path(tmp) / "t")
        sl = Slice(inputs_from_trace(open_trace(path)))
        r, pieces = sl.model()
        lt = memory(lifetimes(sl.inp)).collect()
        for layer, (n, b) in {"api": ("api_count", "api_bytes"),
                              "rm": ("rm_count", "rm_bytes"),
                              "uvm": ("uvm_count", "uvm_bytes")}.items():
            mine = lt.filter(pl.col("layer") == layer)
            assert int(pieces[n].sum()) == mine.height, layer
            assert int(pieces[b].sum() or 0) == int(mine["size_bytes"].sum() or 0), layer
        assert r["_row"].n_unique() == r.height == lt.height  # every row in exactly one piece
        lk = analyze(path, ["leaks"])["leaks"]
    # every process made API calls: the headline is exactly the API layer's leaks,
    # whatever RM and UVM memory backs them (no piece counted in two layers)
    assert lk["total_bytes"] == lk["bytes_by_layer"]["api"]
    assert lk["total_count"] == lk["count_by_layer"]["api"]
    assert sum(s["count"] for s in lk["leak_sites"]) == lk["total_count"]
    assert lk["total_bytes"] == sum(row["bytes"] for row in lk["leaked"])
