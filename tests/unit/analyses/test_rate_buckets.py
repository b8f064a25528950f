"""Plotted rates and the fault-rate report cut time the same way (synthetic traces).

Two defects found by mutation testing (docs/testing.md): an event exactly on a bucket
boundary was plotted in the earlier bucket while the report counted it in the later
window, and when the span was not a whole number of windows the plot's buckets were
narrower than the report's windows, so the plotted peak was not the table's peak.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gputrace.analyses.fault_rate.fault_windows import rates
from gputrace.analyses.helpers.inputs import inputs_from_trace
from gputrace.analyses.timeseries.downsample import bucket_of
from gputrace.analyses.timeseries.rates_over_time import equal_cuts, fault_rates, rate_cuts
from gputrace.trace.builder import TraceBuilder
from gputrace.trace.reader import open_trace


def _trace(tmp_path: Path, times: list[float], duration_s: float) -> Path:
    b = TraceBuilder(layers=("syscall", "cpu_faults"), duration_s=duration_s)
    b.process(5, "p")
    for k, t in enumerate(times):
        b.cpu_fault(t, 5, 0x7F0000000000 + k * 4096, write=True)
    return b.build(tmp_path / "t")


def test_boundary_event_is_in_the_later_bucket(tmp_path: Path) -> None:
    """Span 4 s in 4 buckets: faults at 1.0 s and 2.0 s (exact boundaries) fall in
    buckets 1 and 2, one at 0.5 s in bucket 0, one at the very end (4.0 s) in the last
    bucket (3), never past it."""
    inp = inputs_from_trace(open_trace(_trace(tmp_path, [0.5, 1.0, 2.0, 4.0], 4.0)))
    assert inp.end_ns - inp.start_ns == 4 * 10**9
    got = (inp.scan("faults").sort("ts_ns").select(b=bucket_of(inp, 4)).collect()["b"]
           .to_list())
    assert got == [0, 1, 2, 3]
    (s,) = fault_rates(inp, equal_cuts(inp, 4))["cpu_faults"]["series"]
    assert s["per_s"] == [1.0, 1.0, 1.0, 1.0] and s["events"] == 4


def test_plot_uses_the_reports_windows_when_span_is_not_whole(tmp_path: Path) -> None:
    """Span 2.6 s, window 1 s: the report's windows are [0,1), [1,2), [2,2.6] (a 0.6 s
    remainder is its own window). Faults: 1 at 0.2 s, 2 at 1.1 and 1.9 s, 3 at 2.1,
    2.3 and 2.5 s. Plot buckets are those windows: rates 1, 2 and 3/0.6 = 5 per second,
    and the busiest bucket equals the report's peak (5/s starting at 2 s)."""
    times = [0.2, 1.1, 1.9, 2.1, 2.3, 2.5]
    inp = inputs_from_trace(open_trace(_trace(tmp_path, times, 2.6)))
    cuts = rate_cuts(inp, 1.0)
    assert cuts.starts_ns == [0.0, 1e9, 2e9]
    (s,) = fault_rates(inp, cuts)["cpu_faults"]["series"]
    assert s["t_s"] == [0.0, 1.0, 2.0]
    assert s["per_s"] == [1.0, 2.0, 5.0]
    (row,) = rates(inp.scan("faults"), inp.start_ns, inp.end_ns, 1.0).collect().to_dicts()
    assert max(s["per_s"]) == 5.0
    assert row["peak_per_s"] == pytest.approx(5.0)  # 3 / 0.6 in floating point
    assert row["peak_window_start_s"] == 2.0


def test_more_windows_than_buckets_falls_back_to_equal_buckets(tmp_path: Path) -> None:
    """Window 0.001 s over 2.6 s is 2,600 windows, more than 10 buckets: 10 equal
    buckets of 0.26 s each."""
    inp = inputs_from_trace(open_trace(_trace(tmp_path, [0.2, 2.5], 2.6)))
    cuts = rate_cuts(inp, 0.001, most=10)
    assert len(cuts.starts_ns) == 10 and cuts.lengths_ns == [0.26e9] * 10
