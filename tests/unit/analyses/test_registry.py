"""The analyses registry is the one list of reports: a report registered there (a toy,
here, added for the test and removed after it) is in `--only`, `--fail-on`, the JSON
document, the terminal output, the HTML page, `gputrace diff` and `fleet analyze`, and
is "not recorded" when its layer is missing, with no other edit; the real entries agree
with the documented JSON keys and the layers their reports say are missing, and every
real report is either aggregated by the fleet or listed as not aggregated. Synthetic
scenario traces only."""

from __future__ import annotations

import dataclasses
import io
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from gputrace import cli
from gputrace.analyses import registry
from gputrace.analyses.helpers.inputs import inputs_from_trace
from gputrace.analyses.registry import Context
from gputrace.analyses.report import Report
from gputrace.analyses.report_spec import FleetUse, Gate, ReportSpec
from gputrace.analyses.run import run_reports
from gputrace.fleet.render import render_fleet_terminal
from gputrace.fleet.render_html import render_fleet_html
from gputrace.fleet.reports import merge, trace_partial
from gputrace.fleet.summarize import fleet_document
from gputrace.trace.reader import open_trace
from tests.analyze_helpers import SCENARIO_DIR, analyze

LEAK = str(SCENARIO_DIR / "training_leak")
OTHER = str(SCENARIO_DIR / "memory_by_process")  # api recorded too, a longer run
NO_API = str(SCENARIO_DIR / "ioctl_latencies")  # syscall layer only
DOCS = Path(__file__).resolve().parents[3] / "docs"
RAN: list[str] = []


def _toy(ctx: Context) -> Report:
    """How many toys did the trace's processes bring? (a test report)"""
    RAN.append(str(ctx.inp.end_ns))
    return Report("toy", "How many toys are there?", True,
                  {"toys": 7, "window_s": ctx.opts.window_s,
                   "span_ms": (ctx.inp.end_ns - ctx.inp.start_ns) // 1_000_000,
                   # keys in neither declared nor name order: the generic sections must
                   # show the declared columns whichever order the rows' keys come in
                   "toy_rows": [{"toys": 3, "pid": 41, "comm": "bear"},
                                {"toys": 4, "pid": 42, "comm": "ball"}],
                   "by_pod": [{"toys": 7, "pod_name": "nursery", "processes": 2}]})


TOY = ReportSpec("toy-count", "toy_count", "Toy count", "How many toys are there?", ("api",),
                 _toy,
                 gates=(Gate("toys", lambda rep, _: f"toys: {rep['toys']}" if rep["toys"]
                             else None),),
                 fleet=FleetUse(sums=("toys", "span_ms")),
                 columns={"toy_rows": ("pid", "comm", "toys")})


@contextmanager
def registered(spec: ReportSpec) -> Iterator[None]:
    """`spec` in the registry (last) while the block runs, and gone after it."""
    before = list(registry.REPORTS)
    registry.REPORTS.append(spec)
    try:
        yield
    finally:
        registry.REPORTS[:] = before


@pytest.fixture
def toy() -> Iterator[None]:
    with registered(TOY):
        yield


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


def test_toy_report_columns_the_same_from_cli_and_json(
        toy: None, capsys: pytest.CaptureFixture[str]) -> None:
    """The generic terminal and HTML sections show a list's declared columns in declared
    order (an undeclared list: name order), whether they render the report as computed
    (the CLI) or after a JSON round trip, which sorts keys (the tests, a saved document)."""
    from gputrace.render.html import Page
    from gputrace.render.html_sections import generic_section, groups_section
    from gputrace.render.json_doc import render_json
    from gputrace.render.terminal import render_terminal

    computed = run_reports(inputs_from_trace(open_trace(LEAK)), ["toy-count"])
    round_trip = json.loads(render_json(computed))
    assert list(computed["toy_count"]["toy_rows"][0]) != list(round_trip["toy_count"][
        "toy_rows"][0]), "the two paths must differ in key order for this test to mean much"
    rc, cli_text, err = run(capsys, LEAK, "--only", "toy-count")
    assert rc == 0, err
    texts = []
    for doc in (computed, round_trip):
        buf = io.StringIO()
        render_terminal(doc, buf, color=False)
        texts.append(buf.getvalue())
    assert cli_text == texts[0] == texts[1]
    header = next(ln for ln in cli_text.splitlines() if "pid" in ln and "comm" in ln)
    assert header.index("pid") < header.index("comm") < header.index("toys")
    pods = next(ln for ln in cli_text.splitlines() if "pod_name" in ln)
    assert pods.index("pod_name") < pods.index("processes") < pods.index("toys")
    pages = []
    for doc in (computed, round_trip):
        page = Page("t")
        generic_section(page, TOY, doc["toy_count"])
        groups_section(page, TOY, doc["toy_count"])
        pages.append("".join(page.parts))
    assert pages[0] == pages[1]
    assert pages[0].index("<th>pid</th><th>comm</th><th>toys</th>") > 0
    assert pages[0].index("<th>pod_name</th><th>processes</th><th>toys</th>") > 0


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


def test_registered_only_inside_the_block() -> None:
    """The test's registration leaves the registry as it found it."""
    before = list(registry.REPORTS)
    with registered(TOY):
        assert registry.REPORTS[-1] is TOY
    assert before == registry.REPORTS


def test_toy_report_in_html(toy: None, tmp_path: Path) -> None:
    """The HTML page has a section for a report with no section of its own (the generic
    one: its question, figures and row tables), after the real reports' sections."""
    out = tmp_path / "r.html"
    assert cli.main(["analyze", LEAK, "-f", "html", "-o", str(out)]) == 0
    page = out.read_text()
    assert "<h2>Toy count</h2>" in page and "How many toys are there?" in page
    assert "<dt>toys</dt><dd>7</dd>" in page and "<h3>toy_rows</h3>" in page
    assert page.index("<h2>ioctl latency per command</h2>") < page.index("<h2>Toy count</h2>")
    assert cli.main(["analyze", LEAK, "--only", "leaks", "-f", "html", "-o", str(out)]) == 0
    assert "<h2>Toy count</h2>" not in out.read_text()  # left out: not drawn at all


def test_toy_report_not_recorded_without_its_layer(toy: None, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A trace without the toy's one layer (api) gets its "not recorded" report from the
    registry entry alone: the toy's own step never runs, and JSON, terminal and HTML all
    say which layer is missing."""
    RAN.clear()
    rc, out, err = run(capsys, NO_API, "--only", "toy-count", "-f", "json")
    assert rc == 0, err
    rep = json.loads(out)["toy_count"]
    assert (rep["recorded"], rep["not_recorded_layers"]) == (False, ["api"])
    assert rep["question"] == "How many toys are there?" and "toys" not in rep
    assert rep["warnings"][0] == ("toy-count: layer(s) api not recorded in this trace; "
                                  "nothing was measured")
    assert RAN == []
    rc, out, err = run(capsys, NO_API, "--only", "toy-count")
    assert rc == 0, err
    assert "not recorded in this trace (layers missing): Toy count (api)" in out
    html = tmp_path / "r.html"
    assert cli.main(["analyze", NO_API, "-f", "html", "-o", str(html)]) == 0
    assert "Toy count (api)" in html.read_text()  # one line for the absent layers
    rc, _, err = run(capsys, LEAK, "--only", "toy-count", "-f", "json")
    assert rc == 0 and len(RAN) == 1  # with the layer, it runs


def test_toy_report_in_diff(toy: None, tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    """`gputrace diff` compares a report that declares no comparison on its top-level
    figures: the toy's span differs between two traces, its count does not."""
    before, after = analyze(LEAK), analyze(OTHER)
    assert cli.main(["diff", LEAK, OTHER, "-f", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    (row,) = d["toy_count"]
    assert row["field"] == "span_ms"
    assert row["status"] == ("grown" if row["value"]["delta"] > 0 else "shrunk")
    assert row["value"]["delta"] == (after["trace"]["end_ts_ns"] - after["trace"]["start_ts_ns"]
                                     ) // 1_000_000 - (before["trace"]["end_ts_ns"]
                                                       - before["trace"]["start_ts_ns"]
                                                       ) // 1_000_000 != 0
    assert d["changed"] is True and d["not_compared"] == ["fragmentation"]
    assert cli.main(["diff", LEAK, OTHER]) == 0
    out = capsys.readouterr().out
    assert "Toy count" in out and "span_ms" in out
    assert "not compared: fragmentation" in out
    page = tmp_path / "d.html"
    assert cli.main(["diff", LEAK, OTHER, "-f", "html", "-o", str(page)]) == 0
    assert "<h2>Toy count</h2>" in page.read_text() and "span_ms" in page.read_text()
    assert cli.main(["diff", LEAK, LEAK, "-f", "json"]) == 0
    same = json.loads(capsys.readouterr().out)
    assert same["toy_count"] == [] and same["changed"] is False


def not_aggregated() -> list[str]:
    """The reports the registry declares no fleet aggregation for, in registry order."""
    return [s.name for s in registry.REPORTS if not (s.fleet.answers or s.fleet.sums)]


def _fleet(paths: list[str]) -> dict[str, Any]:
    """The fleet document of `paths`, each analyzed as a fleet task does (in process, so
    the test's registration holds)."""
    procs = pl.DataFrame(schema={"pid": pl.Int64, "cmdline": pl.String})
    parts = []
    for i, path in enumerate(paths):
        entry = {"trace_id": f"t{i}", "host": "h", "date": "2026-01-01", "status": "complete",
                 "driver_version": None, "gpu_model": None, "drops": {}}
        doc = run_reports(inputs_from_trace(open_trace(path)))
        parts.append(trace_partial(entry, doc, procs, False))
    return fleet_document(merge(parts, None), top=None, dataset="ds", where=None,
                          engine={"workers": 1, "scheduler": "local"})


def test_toy_report_in_fleet(toy: None) -> None:
    """`fleet analyze` adds up the figures a report declares (over the traces that
    recorded it: not the one without the api layer), and lists a report that declares
    no aggregation as not aggregated, in terminal and HTML too."""
    spans = [(lambda t: (t["end_ts_ns"] - t["start_ts_ns"]) // 1_000_000)(analyze(p)["trace"])
             for p in (LEAK, OTHER)]
    doc = _fleet([LEAK, OTHER, NO_API])
    assert doc["report_totals"]["toy_count"] == {"traces": 2, "toys": 14, "span_ms": sum(spans)}
    assert [r["report"] for r in doc["not_aggregated"]] == not_aggregated()
    buf = io.StringIO()
    render_fleet_terminal(doc, buf)
    text = buf.getvalue()
    assert "Report totals" in text and re.search(r"toy_count\s+2\s+toys\s+14", text)
    assert "Reports not aggregated across traces" in text and "summary" in text
    page = render_fleet_html(doc)
    assert "<h2>Report totals</h2>" in page and "toy_count" in page
    plain = dataclasses.replace(TOY, name="toy-plain", key="toy_plain", fleet=FleetUse())
    with registered(plain):
        doc = _fleet([LEAK])
        listed = not_aggregated()
    assert [r["report"] for r in doc["not_aggregated"]] == listed and listed[-1] == "toy-plain"
    assert doc["not_aggregated"][-1]["why"] == "no fleet aggregation declared"


def test_fleet_answers_are_fleet_document_keys() -> None:
    """Each report's declared fleet answers are keys of the fleet document, and every
    report is aggregated or listed as not aggregated."""
    doc = _fleet([LEAK])
    listed = {r["report"] for r in doc["not_aggregated"]}
    for spec in registry.REPORTS:
        assert set(spec.fleet.answers) <= set(doc), spec.name
        assert bool(spec.fleet.answers or spec.fleet.sums) != (spec.name in listed)


def test_no_report_repeats_its_layer_list() -> None:
    """The layers of a report are written once, in its registry entry: no analysis module
    spells them out again for its "not recorded" report."""
    root = Path(__file__).resolve().parents[3] / "gputrace" / "analyses"
    for spec in registry.REPORTS:
        listed = ", ".join(f'"{x}"' for x in spec.layers)
        for path in root.glob("*.py"):
            if path.name != "registry.py":
                assert f"[{listed}]" not in path.read_text(), (spec.name, path.name)


def test_every_named_section_resolves() -> None:
    """Each terminal and HTML section a registry entry names is a function that exists
    (a misspelt "module:function" fails here, not in a user's report)."""
    from gputrace.analyses.report_spec import resolve

    for spec in registry.REPORTS:
        for path in (spec.terminal, spec.terminal_by_layer, *spec.html):
            if path is not None:
                assert callable(resolve(path)), (spec.name, path)


TOY_MODULE = '''
"""How many toys are there? (a report of a test, found where a real one would be)"""
from gputrace.analyses.report import Report
from gputrace.analyses.report_spec import ReportSpec


def _run(ctx):
    return Report("toy-found", SPEC.question, True, {"toys": 3})


SPEC = ReportSpec("toy-found", "toy_found", "Toys found", "How many toys are there?",
                  ("api",), _run, place=15)
'''


def test_a_report_module_is_found_with_no_other_edit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module holding a `SPEC`, dropped among the analyses (here: a folder added to the
    package's path), is a report: listed at its place, run by `analyze`, with no registry
    entry or other list edited."""
    import sys

    import gputrace.analyses as package

    (tmp_path / "toy_found.py").write_text(TOY_MODULE)
    monkeypatch.setattr(package, "__path__", [*package.__path__, str(tmp_path)])
    monkeypatch.delitem(sys.modules, "gputrace.analyses.toy_found", raising=False)
    try:
        found = registry.discover()
        assert [s.name for s in found][:2] == ["leaks", "toy-found"]  # place 15
        with registered(found[1]):
            assert "toy-found" in registry.names()
            doc = run_reports(inputs_from_trace(open_trace(LEAK)), ["toy-found"])
            assert doc["toy_found"]["toys"] == 3
    finally:
        sys.modules.pop("gputrace.analyses.toy_found", None)
    monkeypatch.undo()
    assert "toy-found" not in [s.name for s in registry.discover()]


def test_each_report_is_declared_in_its_own_module() -> None:
    """Every entry's steps live in the module that holds its `SPEC` (the report is one
    module): none is declared in the registry, which lists what it finds."""
    import importlib

    for spec in registry.REPORTS:
        module = importlib.import_module(spec.run.__module__)
        assert getattr(module, "SPEC", None) is spec, spec.name
        assert spec.run.__module__ != registry.__name__
