"""`gputrace analyze` end to end: output formats, --only, -o, --fail-on, bad options."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.analyze_helpers import SCENARIO_DIR
from tests.cli_helpers import cli
from tests.unit.commands.test_errors import assert_one_line_error

LEAK = str(SCENARIO_DIR / "training_leak")
STORM = str(SCENARIO_DIR / "uvm_storm")
FRAG = str(SCENARIO_DIR / "fragmented_gpu")


def test_json_output_parses_and_has_the_contract() -> None:
    r = cli("analyze", LEAK, "--format", "json")
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
    r = cli("analyze", LEAK, "--only", "leaks,summary", "-f", "json", "-o", str(out))
    assert r.returncode == 0 and r.stdout == ""
    doc = json.loads(out.read_text())
    assert doc["fault_rate"] is None and doc["fragmentation"] is None
    assert doc["leaks"] is not None and doc["summary"] is not None


def test_terminal_output_fits_100_columns(tmp_path: Path) -> None:
    out = tmp_path / "report.txt"
    r = cli("analyze", STORM, "-o", str(out))
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert "Thrashing blocks" in text and "OVERSUBSCRIBED" in text
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "\x1b[" not in text  # no colour codes in files


@pytest.mark.parametrize(("trace", "cond"), [
    (LEAK, "leaks"), (LEAK, "growth"), (STORM, "thrashing"), (FRAG, "fragmentation>0.5")])
def test_fail_on_exits_3(trace: str, cond: str) -> None:
    r = cli("analyze", trace, "--fail-on", cond, "-f", "json")
    assert r.returncode == 3, r.stderr
    assert json.loads(r.stdout)  # the report is still written
    assert len(r.stderr.strip().splitlines()) == 1 and "--fail-on" in r.stderr


def test_fail_on_not_triggered_exits_0() -> None:
    r = cli("analyze", FRAG, "--fail-on", "fragmentation>0.999,thrashing", "-f", "json")
    assert r.returncode == 0, r.stderr


def test_leak_filters() -> None:
    r = cli("analyze", LEAK, "--only", "leaks", "-f", "json", "--older", "10s",
                 "--min-size", "4MiB", "--top", "3")
    doc = json.loads(r.stdout)["leaks"]
    assert len(doc["allocations"]) == 3
    assert doc["count_by_layer"]["api"] == 11  # made at 0.9 s .. 10.9 s, end at 21 s
    r = cli("analyze", LEAK, "--only", "leaks", "-f", "json", "--min-size", "9MiB")
    assert json.loads(r.stdout)["leaks"]["total_bytes"] == 0


def test_top_cuts_the_report_rows_cut_the_terminal(tmp_path: Path) -> None:
    """--top: rows each report keeps per list (in the JSON too); --rows: rows each terminal
    table shows, the report keeping all (the rest counted); --rows defaults to --top."""
    whole = json.loads(cli("analyze", LEAK, "--only", "leaks", "-f", "json").stdout)["leaks"]
    n = len(whole["allocations"])
    assert n > 3
    top = json.loads(cli("analyze", LEAK, "--only", "leaks", "-f", "json", "--top", "2",
                         "--rows", "50").stdout)["leaks"]
    assert len(top["allocations"]) == 2 and top["total_count"] == whole["total_count"]
    # the per-layer view lists every allocation (the joined view folds this scenario's 20
    # identical pieces into one row, `pieces` 20, so it has nothing to cut)
    assert len(whole["leaked"]) == 1 and whole["leaked"][0]["pieces"] == n
    r = cli("analyze", LEAK, "--only", "leaks", "--by-layer", "--rows", "1",
            "-o", str(tmp_path / "r.txt"))
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "r.txt").read_text()
    assert f"... {n - 1} more (use --rows or --format json)" in text
    r = cli("analyze", LEAK, "--only", "leaks", "--by-layer", "--top", "1",
            "-o", str(tmp_path / "t.txt"))
    assert (tmp_path / "t.txt").read_text() != text  # the report itself holds 1 row
    assert "more (use --rows" not in (tmp_path / "t.txt").read_text().split("Growth")[0]
    assert_one_line_error(cli("analyze", LEAK, "--rows", "some"), "--rows")


@pytest.mark.parametrize(("args", "needle"), [
    (["--only", "leaks,bogus"], "unknown report bogus"),
    (["--format", "svg"], "--format"),
    (["--fail-on", "sometimes"], "--fail-on"),
    (["--older", "ten minutes"], "--older"),
    (["--min-size", "lots"], "--min-size"),
    (["--only", "summary", "--fail-on", "leaks"], "needs the leaks report"),
])
def test_bad_options_are_one_line_errors(args: list[str], needle: str) -> None:
    r = cli("analyze", LEAK, *args)
    assert_one_line_error(r, needle)


def test_missing_trace_is_one_line_error(tmp_path: Path) -> None:
    assert_one_line_error(cli("analyze", str(tmp_path / "nope")), "no such trace")


# ------------------------------------------------- doubts about the trace itself
def _built(tmp_path: Path, **manifest_edits: object) -> Path:
    """Synthetic: one process, RM and API allocations, one GPU fault; manifest edited."""
    from gputrace.trace.builder import MiB, TraceBuilder

    b = TraceBuilder(layers=("syscall", "api", "driver"), duration_s=4.0)
    b.process(100, "train")
    b.cuda_alloc(1.0, 100, 4 * MiB)
    b.gpu_fault(2.0, 0, 0x7F0000000000, pid=100)
    path = b.build(tmp_path / "trace")
    mpath = path / "manifest.json"
    m = json.loads(mpath.read_text())
    for key, value in manifest_edits.items():
        m[key] = value(m) if callable(value) else value
    mpath.write_text(json.dumps(m))
    return path


def _warned_everywhere(path: Path, *needles: str) -> None:
    """Every report (JSON) and the terminal output carry a warning with all needles."""
    from gputrace.cli import main

    def hit(ws: list[str]) -> bool:
        return any(all(n in w for n in needles) for w in ws)

    out = path.parent / "report.json"
    assert main(["analyze", str(path), "-f", "json", "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert hit(doc["warnings"]), doc["warnings"]
    for key in ("leaks", "fault_rate", "fragmentation", "summary"):
        assert hit(doc[key]["warnings"]), (key, doc[key]["warnings"])
    txt = path.parent / "report.txt"
    assert main(["analyze", str(path), "-o", str(txt)]) == 0
    lines = [ln for ln in txt.read_text().splitlines() if ln.startswith("warning:")]
    assert hit(lines), lines


def test_rows_announced_but_missing_warn_in_every_report(tmp_path: Path) -> None:
    def more(m: dict[str, dict[str, dict[str, int]]]) -> object:
        t = m["tables"]
        t["cuda_calls"]["rows"] += 1000
        return t

    _warned_everywhere(_built(tmp_path, tables=more), "cuda_calls", "1001")


def test_rows_outside_the_time_span_warn_in_every_report(tmp_path: Path) -> None:
    from gputrace.trace.builder import ns

    _warned_everywhere(_built(tmp_path, end_ts_ns=ns(1.5)), "faults", "outside")


def test_end_before_start_is_an_error_or_a_warning_never_negative_rates(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gputrace.cli import main
    from gputrace.trace.builder import ns

    path = _built(tmp_path, end_ts_ns=ns(-3.0))
    rc = main(["analyze", str(path), "-f", "json"])
    cap = capsys.readouterr()
    if rc != 0:  # refused when the trace is opened
        assert len(cap.err.strip().splitlines()) == 1 and "end_ts_ns" in cap.err
        return
    doc = json.loads(cap.out)
    assert doc["trace"]["duration_s"] >= 0
    assert any("end_ts_ns" in w for w in doc["warnings"])
    assert all(r["mean_per_s"] >= 0 for r in doc["fault_rate"]["rates"])


def test_end_before_start_inputs_fall_back_to_the_rows_span(tmp_path: Path) -> None:
    """Below the manifest check: analyses never see a negative span."""
    from gputrace.analyses.helpers.inputs import inputs_from_trace, trace_warnings
    from gputrace.trace.builder import T0_NS, ns
    from gputrace.trace.reader import Trace

    path = _built(tmp_path)
    m = json.loads((path / "manifest.json").read_text())
    m["end_ts_ns"] = ns(-3.0)
    inp = inputs_from_trace(Trace(path, m))  # the constructor does not validate
    assert (inp.start_ns, inp.end_ns) == (T0_NS + 10**9, T0_NS + 2 * 10**9)
    assert any("before its start_ts_ns" in w for w in trace_warnings(inp))
