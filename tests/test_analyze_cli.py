"""`gputrace analyze` end to end: output formats, --only, -o, --fail-on, bad options."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.analyze_helpers import SCENARIO_DIR
from tests.test_errors import assert_one_line_error, gputrace

LEAK = str(SCENARIO_DIR / "training_leak")
STORM = str(SCENARIO_DIR / "uvm_storm")
FRAG = str(SCENARIO_DIR / "fragmented_gpu")


def test_json_output_parses_and_has_the_contract() -> None:
    r = gputrace("analyze", LEAK, "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert {"leaks", "fault_rate", "fragmentation", "summary", "warnings"} <= set(doc)
    a = doc["leaks"]["allocations"][0]
    assert set(a) >= {"layer", "pid", "comm", "kind", "id", "size_bytes", "alloc_ts_ns",
                      "stack_id"}
    assert isinstance(doc["leaks"]["total_bytes"], int)
    assert r.stdout == json.dumps(doc, indent=2, sort_keys=True) + "\n"  # stable, sorted


def test_only_and_output_file(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    r = gputrace("analyze", LEAK, "--only", "leaks,summary", "-f", "json", "-o", str(out))
    assert r.returncode == 0 and r.stdout == ""
    doc = json.loads(out.read_text())
    assert doc["fault_rate"] is None and doc["fragmentation"] is None
    assert doc["leaks"] is not None and doc["summary"] is not None


def test_terminal_output_fits_100_columns(tmp_path: Path) -> None:
    out = tmp_path / "report.txt"
    r = gputrace("analyze", STORM, "-o", str(out))
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert "Thrashing blocks" in text and "OVERSUBSCRIBED" in text
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "\x1b[" not in text  # no colour codes in files


@pytest.mark.parametrize(("trace", "cond"), [
    (LEAK, "leaks"), (LEAK, "growth"), (STORM, "thrashing"), (FRAG, "fragmentation>0.5")])
def test_fail_on_exits_3(trace: str, cond: str) -> None:
    r = gputrace("analyze", trace, "--fail-on", cond, "-f", "json")
    assert r.returncode == 3, r.stderr
    assert json.loads(r.stdout)  # the report is still written
    assert len(r.stderr.strip().splitlines()) == 1 and "--fail-on" in r.stderr


def test_fail_on_not_triggered_exits_0() -> None:
    r = gputrace("analyze", FRAG, "--fail-on", "fragmentation>0.999,thrashing", "-f", "json")
    assert r.returncode == 0, r.stderr


def test_leak_filters() -> None:
    r = gputrace("analyze", LEAK, "--only", "leaks", "-f", "json", "--older", "10s",
                 "--min-size", "4MiB", "--top", "3")
    doc = json.loads(r.stdout)["leaks"]
    assert len(doc["allocations"]) == 3
    assert doc["count_by_layer"]["api"] == 11  # made at 0.9 s .. 10.9 s, end at 21 s
    r = gputrace("analyze", LEAK, "--only", "leaks", "-f", "json", "--min-size", "9MiB")
    assert json.loads(r.stdout)["leaks"]["total_bytes"] == 0


@pytest.mark.parametrize(("args", "needle"), [
    (["--only", "leaks,bogus"], "unknown report bogus"),
    (["--format", "html"], "--format"),
    (["--fail-on", "sometimes"], "--fail-on"),
    (["--older", "ten minutes"], "--older"),
    (["--min-size", "lots"], "--min-size"),
    (["--only", "summary", "--fail-on", "leaks"], "needs the leaks report"),
])
def test_bad_options_are_one_line_errors(args: list[str], needle: str) -> None:
    r = gputrace("analyze", LEAK, *args)
    assert_one_line_error(r, needle)


def test_missing_trace_is_one_line_error(tmp_path: Path) -> None:
    assert_one_line_error(gputrace("analyze", str(tmp_path / "nope")), "no such trace")
