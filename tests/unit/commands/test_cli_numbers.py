"""Number options and gates: a bad value is one line and exit 2, never a traceback,
a hang or a silently useless answer; a gate on an unrecorded layer says so.

Traces are synthetic (gputrace.trace.builder); every case runs through gputrace.cli.main.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gputrace.cli import main
from gputrace.errors import UsageError
from gputrace.options import (
    INT64_MAX,
    parse_count,
    parse_duration_ns,
    parse_fraction,
    parse_size,
)
from gputrace.trace.builder import MiB, TraceBuilder

BIG = str(1 << 64)


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Synthetic: every layer, a leak and a few GPU faults."""
    b = TraceBuilder(layers=("syscall", "api", "driver"), duration_s=4.0)
    b.process(100, "train")
    b.cuda_alloc(0.5, 100, 4 * MiB)
    for i in range(5):
        b.gpu_fault(1.0 + i * 0.1, 0, 0x7F0000000000 + i * 4096, pid=100)
    return b.build(tmp_path_factory.mktemp("numbers") / "trace")


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


def assert_usage_error(rc: int, out: str, err: str, needle: str) -> None:
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("gputrace: error: "), err
    assert needle in lines[0], err
    assert "Traceback" not in err and out == ""


ANALYZE_BAD = [
    ("--window", "nan"), ("--window", "inf"), ("--window", "-inf"), ("--window", "1e300"),
    ("--window", "0"), ("--window", "-1"), ("--window", "0.5ns"), ("--window", "1e-10"),
    ("--window", "5 parsecs"), ("--window", ""),
    ("--oom-window", "nan"), ("--oom-window", "0"), ("--oom-window", "-1s"),
    ("--oom-window", "1e300"), ("--oom-window", ""),
    ("--top", "nan"), ("--top", "-1"), ("--top", BIG), ("--top", "1e3"), ("--top", "2.5"),
    ("--thrash-min", "0"), ("--thrash-min", "nan"), ("--thrash-min", BIG),
    ("--older", "nan"), ("--older", "inf"), ("--older", "-5s"), ("--older", "1e300"),
    ("--older", "9" * 5000),
    ("--min-size", "nan"), ("--min-size", "inf"), ("--min-size", "-1"), ("--min-size", BIG),
    ("--min-size", "1e300"),
]


@pytest.mark.parametrize(("option", "value"), ANALYZE_BAD)
def test_analyze_bad_numbers(capsys: pytest.CaptureFixture[str], trace: Path, option: str,
                             value: str) -> None:
    assert_usage_error(*run(capsys, "analyze", str(trace), option, value), option)


@pytest.mark.parametrize("cond", ["fragmentation>nan", "fragmentation>inf",
                                  "fragmentation>1.5", "fragmentation>-0.1",
                                  "fragmentation>1", "fragmentation>1e300",
                                  "fragmentation>"])
def test_fail_on_bad_threshold(capsys: pytest.CaptureFixture[str], trace: Path,
                               cond: str) -> None:
    assert_usage_error(*run(capsys, "analyze", str(trace), "--fail-on", cond), "--fail-on")


@pytest.mark.parametrize("value", ["nan", "-1", BIG, "1e3", "inf"])
def test_dump_bad_limit(capsys: pytest.CaptureFixture[str], trace: Path, value: str) -> None:
    assert_usage_error(*run(capsys, "dump", str(trace), "faults", "--limit", value), "--limit")


def test_options_are_checked_before_the_trace_is_read(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert_usage_error(*run(capsys, "analyze", str(tmp_path / "none"), "--top", "nan"),
                       "--top")


def test_good_edges_work(capsys: pytest.CaptureFixture[str], trace: Path) -> None:
    rc, out, err = run(capsys, "analyze", str(trace), "--only", "fault-rate", "-f", "json",
                       "--window", "1ns", "--top", "0", "--thrash-min", "1")
    assert rc == 0, err
    rep = json.loads(out)["fault_rate"]
    assert rep["window_s"] == 1e-9
    # five faults in five distinct 1 ns windows: peak 1 per ns, not a division by zero
    assert rep["rates"][0]["faults"] == 5 and rep["rates"][0]["peak_per_s"] == 1e9
    rc, out, err = run(capsys, "analyze", str(trace), "--only", "fault-rate", "-f", "json",
                       "--window", "500ms")
    assert rc == 0 and json.loads(out)["fault_rate"]["window_s"] == 0.5
    rc, out, err = run(capsys, "analyze", str(trace), "--only", "leaks", "-f", "json",
                       "--older", "0", "--min-size", "4MiB", "--top", str(INT64_MAX))
    assert rc == 0, err
    assert json.loads(out)["leaks"]["count_by_layer"]["api"] == 1
    rc, out, err = run(capsys, "dump", str(trace), "faults", "--limit", "2", "-f", "json")
    assert rc == 0 and len(out.splitlines()) == 2
    rc, out, err = run(capsys, "dump", str(trace), "faults", "--limit", str(INT64_MAX),
                       "-f", "json")
    assert rc == 0 and len(out.splitlines()) == 5


# ------------------------------------------------------------- unmeasurable gates
@pytest.fixture(scope="module")
def no_driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Synthetic: API and syscall layers only, with CPU faults; no driver layer."""
    b = TraceBuilder(layers=("syscall", "api", "cpu_faults"), duration_s=2.0)
    b.process(100, "train")
    b.cuda_alloc(0.5, 100, 4 * MiB)
    b.cpu_fault(1.0, 100, 0x7F0000000000, write=True)
    return b.build(tmp_path_factory.mktemp("nodriver") / "trace")


@pytest.mark.parametrize("cond", ["thrashing", "fragmentation>0.5"])
def test_gate_on_unrecorded_layer_is_a_usage_error(
        capsys: pytest.CaptureFixture[str], no_driver: Path, cond: str) -> None:
    rc, out, err = run(capsys, "analyze", str(no_driver), "--fail-on", cond, "-f", "json")
    assert_usage_error(rc, out, err, "not recorded")
    assert "driver" in err and cond.split(">")[0] in err


def test_gate_on_no_allocation_layer(capsys: pytest.CaptureFixture[str],
                                     tmp_path: Path) -> None:
    b = TraceBuilder(layers=("driver",), duration_s=1.0)
    b.gpu_fault(0.5, 0, 0x7F0000000000)
    path = b.build(tmp_path / "trace")
    for cond in ("leaks", "growth"):
        assert_usage_error(*run(capsys, "analyze", str(path), "--fail-on", cond),
                           "not recorded")


def test_gates_that_can_be_measured_still_run(capsys: pytest.CaptureFixture[str],
                                              no_driver: Path, trace: Path) -> None:
    rc, _, err = run(capsys, "analyze", str(no_driver), "--fail-on", "leaks", "-f", "json")
    assert rc == 3 and "leaks: 1 leaked" in err
    rc, _, err = run(capsys, "analyze", str(trace), "--fail-on", "thrashing", "-f", "json")
    assert rc == 0, err  # driver recorded, no thrashing: a real pass


# ------------------------------------------------------------------ the parsers
@given(st.text(max_size=60))
def test_parsers_answer_in_range_or_refuse(text: str) -> None:
    for parse, lo in ((parse_count, 0), (parse_size, 0)):
        try:
            v = parse(text, "--x")
        except UsageError as e:
            assert "\n" not in str(e)
        else:
            assert isinstance(v, int) and lo <= v <= INT64_MAX
    try:
        ns = parse_duration_ns(text, "--x")
    except UsageError:
        pass
    else:
        assert isinstance(ns, int) and 1 <= ns <= INT64_MAX
    try:
        f = parse_fraction(text, "--x")
    except UsageError:
        pass
    else:
        assert 0.0 <= f < 1.0


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_duration_of_any_float_text(x: float) -> None:
    try:
        ns = parse_duration_ns(repr(x), "--x")
    except UsageError:
        assert not (1e-9 <= x <= 9.2e9)  # refused only when out of range
    else:
        assert 1 <= ns <= INT64_MAX and abs(ns - x * 1e9) <= max(1.0, x * 1e9 * 1e-12)


def test_parser_examples() -> None:
    assert parse_duration_ns("0.1", "-d") == 100_000_000
    assert parse_duration_ns("1.5s", "-d") == 1_500_000_000
    assert parse_duration_ns("2m", "-d") == 120_000_000_000
    assert parse_duration_ns("250ns", "-d") == 250
    assert parse_duration_ns("0", "--older", minimum_ns=0) == 0
    assert parse_size("64KiB", "--min-size") == 65536
    assert parse_size("1GB", "--min-size") == 10**9
    assert parse_count("007", "--top") == 7
    assert parse_fraction("0.5", "--fail-on") == 0.5
