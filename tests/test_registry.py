"""The analyses registry is the one list of reports: a report registered there (a toy,
here) is in `--only`, `--fail-on`, the JSON document and the terminal output with no
other edit, and the real entries agree with the documented JSON keys and the layers
their reports say are missing. Synthetic scenario traces only."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from gputrace import cli
from gputrace.analyses import registry
from gputrace.analyses.registry import Context
from gputrace.analyses.report import Report
from gputrace.analyses.report_spec import Gate, ReportSpec
from tests.analyze_helpers import SCENARIO_DIR, analyze

LEAK = str(SCENARIO_DIR / "training_leak")
DOCS = Path(__file__).resolve().parent.parent / "docs"


def _toy(ctx: Context) -> Report:
    """How many toys did the trace's processes bring? (a test report)"""
    return Report("toy", "How many toys are there?", True,
                  {"toys": 7, "window_s": ctx.opts.window_s,
                   "toy_rows": [{"pid": 41, "toys": 3}, {"pid": 42, "toys": 4}]})


TOY = ReportSpec("toy-count", "toy_count", "Toy count", (), _toy,
                 gates=(Gate("toys", lambda rep, _: f"toys: {rep['toys']}" if rep["toys"]
                             else None),))


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "REPORTS", [*registry.REPORTS, TOY])


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = cli.main(["analyze", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_toy_report_in_json(toy: None, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, LEAK, "--only", "toy-count", "-f", "json", "--window", "2s")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["toy_count"]["toys"] == 7 and doc["toy_count"]["window_s"] == 2.0
    assert doc["toy_count"]["recorded"] is True
    assert doc["leaks"] is None and doc["fault_rate"] is None  # not asked for
    rc, out, err = run(capsys, LEAK, "-f", "json")  # every report, the toy included
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["toy_count"]["toys"] == 7 and doc["leaks"]["total_count"] > 0


def test_toy_report_in_terminal(toy: None, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, LEAK, "--only", "toy-count,leaks")
    assert rc == 0, err
    assert "Toy count" in out and "How many toys are there?" in out
    assert "toys: 7" in out and "toy_rows" in out and "42" in out
    # registry order: leaks before the toy, whatever order --only names them in
    assert out.index("Leaks") < out.index("Toy count")


def test_toy_report_in_only_and_fail_on(toy: None, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, LEAK, "--only", "nope")
    assert rc == 2 and "toy-count" in err
    rc, _, err = run(capsys, LEAK, "--only", "leaks", "--fail-on", "toys")
    assert rc == 2 and "--fail-on toys needs the toy-count report" in err
    rc, _, err = run(capsys, LEAK, "--only", "toy-count", "--fail-on", "toys", "-f", "json")
    assert rc == 3 and "--fail-on: toys: 7" in err


def test_without_registration_the_toy_is_unknown(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, LEAK, "--only", "toy-count")
    assert rc == 2 and "unknown report toy-count" in err


def test_json_keys_are_the_documented_ones() -> None:
    text = (DOCS / "json-report.md").read_text()
    top = text.split("## Top level", 1)[1].split("##", 1)[0]
    documented = re.findall(r"^\| `(\w+)` \| object or null \|", top, re.M)
    assert documented == [s.key for s in registry.REPORTS]
    for spec in registry.REPORTS:
        assert (DOCS / "analyses" / f"{spec.name}.md").exists(), spec.name
    assert len({s.name for s in registry.REPORTS}) == len(registry.REPORTS)
    assert len({g.name for g in registry.gates()}) == len(registry.gates())


def test_missing_layers_are_declared_layers() -> None:
    """Each report names as missing only layers its registry entry says it reads."""
    doc: dict[str, Any] = analyze(LEAK)
    assert any(doc[s.key]["not_recorded_layers"] for s in registry.REPORTS)
    for spec in registry.REPORTS:
        assert set(doc[spec.key]["not_recorded_layers"]) <= set(spec.layers), spec.name
