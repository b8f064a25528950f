"""`gputrace fleet analyze` on a local Dask cluster of 2 worker processes: totals are the
sums of the per-trace `analyze` results, `--where` selects exactly, unfinished traces and
traces with drops are flagged, and a fleet of one reports what `analyze` reports.

The commands run in the test's process (`tests.cli_helpers.cli`). The whole fleet's
report and the terminal report start their own local cluster (`--workers 2`); the other
reports run on the module's shared cluster (`--scheduler`, the `dask_scheduler`
fixture), which `test_scheduler_address_runs_on_that_cluster` checks gives the same
report. Errors that Dask could add lines to run as a subprocess."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gputrace.analyses.helpers.inputs import inputs_from_trace
from gputrace.analyses.run import run_reports
from gputrace.trace.reader import open_trace
from tests.analyze_helpers import SCENARIO_DIR
from tests.cli_helpers import cli
from tests.unit.commands.test_errors import assert_one_line_error, gputrace
from tests.unit.fleet.test_fleet_export import fleet_traces

# One pytest-xdist worker runs every test here: most share `world` (an exported fleet
# and its analysis, the slowest set-up of the suite), built once per worker.
pytestmark = pytest.mark.xdist_group("fleet_analyze")


def fleet(dataset: Path, *args: str) -> dict[str, Any]:
    r = cli("fleet", "analyze", str(dataset), "--workers", "2", "-f", "json", *args)
    assert r.returncode == 0, r.stderr
    doc: dict[str, Any] = json.loads(r.stdout)
    assert doc["engine"]["workers"] == 2
    return doc


@pytest.fixture
def on_cluster(dask_scheduler: str) -> list[str]:
    """The options that run `fleet analyze` on the shared cluster."""
    return ["--scheduler", dask_scheduler]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The exported fleet, each trace's analyze document, and its index entry."""
    root = tmp_path_factory.mktemp("fleet")
    traces = fleet_traces(root / "src")
    r = cli("export", *map(str, traces), "--to", str(root / "ds"))
    assert r.returncode == 0, r.stderr
    index = json.loads((root / "ds" / "manifest.json").read_text())
    by_source = {e["source"]: e for e in index["traces"].values()}
    per = []
    for t in traces:
        doc = run_reports(inputs_from_trace(open_trace(t)))
        per.append({"entry": by_source[str(t)], "doc": doc})
    return {"ds": root / "ds", "per": per, "all": fleet(root / "ds")}


def total(per: list[dict[str, Any]], key: str = "total_bytes") -> int:
    return sum(int(p["doc"]["leaks"][key]) for p in per)


def test_totals_are_the_sums_of_per_trace_analyze(world: dict[str, Any]) -> None:
    doc, per = world["all"], world["per"]
    assert doc["traces"] == len(per) == 11
    assert doc["leaks"]["total_bytes"] == total(per) > 0
    assert doc["leaks"]["total_count"] == total(per, "total_count")
    rows = {r["trace_id"]: r for r in doc["trace_list"]}
    for p in per:
        assert rows[p["entry"]["trace_id"]]["leak_bytes"] == p["doc"]["leaks"]["total_bytes"]
    jobs = doc["leaks"]["top_jobs"]
    assert [j["bytes"] for j in jobs] == sorted((j["bytes"] for j in jobs), reverse=True)
    # the same call site on hosts synthetic and h1 (training_leak and its copy) is one site
    site = next(s for s in doc["leaks"]["top_sites"]
                if s["frames"] == "cache_grad < train_step < main")
    assert site["hosts"] == ["h1", "synthetic"] and site["traces"] == 2
    assert site["bytes"] == 2 * 160 * 2**20
    # the scenarios' planted truths, now fleet-wide rankings
    assert doc["gpus"]["by_fragmentation"][0]["fragmentation_index"] > 0.99  # fragmented_gpu
    assert doc["gpus"]["by_oversubscription"][0]["oversubscription_ratio"] == 3.0  # uvm_storm
    versions = {v["driver_version"] for v in doc["fault_rate"]["by_driver_version"]}
    assert versions == {"580.142", "575.57.08"}


def test_traces_with_drops_or_still_recording_are_flagged(world: dict[str, Any]) -> None:
    doc = world["all"]
    flagged = {tuple(f["reasons"]) for f in doc["flagged"]}
    assert flagged == {("7 events dropped",), ("status recording",)}
    assert {f["host"] for f in doc["flagged"]} == {"flaky"}
    hosts = {h["host"]: h for h in doc["drops"]["by_host"]}
    assert hosts["flaky"]["dropped"] == 7 and hosts["flaky"]["traces_with_drops"] == 1
    assert hosts["h1"]["dropped"] == 0 and doc["drops"]["total"] == 7
    assert any("2 of 11 traces are flagged" in w for w in doc["warnings"])


def test_where_on_trace_fields_selects_exactly(world: dict[str, Any],
                                               on_cluster: list[str]) -> None:
    per = world["per"]
    doc = fleet(world["ds"], *on_cluster,
                "--where", "host in (h1, h2) and driver_version != '575.57.08'")
    mine = [p for p in per if p["entry"]["host"] == "h1"]
    assert doc["traces"] == len(mine) == 2
    assert doc["leaks"]["total_bytes"] == total(mine)
    assert {r["host"] for r in doc["trace_list"]} == {"h1"}
    none = fleet(world["ds"], *on_cluster, "--where", "host = nowhere or date < 2025-01-01")
    assert none["traces"] == 0 and none["leaks"]["total_bytes"] == 0


def test_where_on_jobs_keeps_only_those_processes(world: dict[str, Any],
                                                  on_cluster: list[str]) -> None:
    doc = fleet(world["ds"], *on_cluster, "--where", "cmdline ~ '^prepro' and not host = h2")
    want = [(p["entry"]["trace_id"], a["bytes"]) for p in world["per"]
            for a in p["doc"]["leaks"]["leaked"] if a["comm"] == "preprocess"]
    assert len({t for t, _ in want}) == 2  # default, and its copy on h1
    assert doc["traces"] == 2
    assert doc["leaks"]["total_bytes"] == sum(b for _, b in want) > 0
    assert {j["comm"] for j in doc["leaks"]["top_jobs"]} == {"preprocess"}


def test_a_fleet_of_one_reports_what_analyze_reports(tmp_path: Path,
                                                     on_cluster: list[str]) -> None:
    trace = SCENARIO_DIR / "training_leak"
    assert cli("export", str(trace), "--to", str(tmp_path / "ds")).returncode == 0
    r = cli("analyze", str(trace), "-f", "json")
    assert r.returncode == 0, r.stderr
    alone = json.loads(r.stdout)
    doc = fleet(tmp_path / "ds", *on_cluster, "--per-trace")
    assert doc["traces"] == 1 and len(doc["per_trace"]) == 1
    assert doc["per_trace"][0]["report"] == alone
    assert doc["leaks"]["total_bytes"] == alone["leaks"]["total_bytes"]
    assert doc["leaks"]["total_count"] == alone["leaks"]["total_count"]


def test_scheduler_address_runs_on_that_cluster(world: dict[str, Any],
                                                dask_scheduler: str) -> None:
    doc = fleet(world["ds"], "--scheduler", dask_scheduler)
    assert doc["engine"]["scheduler"] == dask_scheduler
    for key in ("traces", "leaks", "gpus", "fault_rate", "drops", "flagged"):
        assert doc[key] == world["all"][key]


def test_terminal_report(world: dict[str, Any]) -> None:
    r = cli("fleet", "analyze", str(world["ds"]), "--workers", "2", "--top", "3")
    assert r.returncode == 0, r.stderr
    for heading in ("Top leaking jobs", "Top leaking call sites", "GPUs by fragmentation",
                    "GPUs by oversubscription", "Fault rate per driver version",
                    "Drops per host", "Flagged traces"):
        assert heading in r.stdout
    assert "11 traces, 2 workers (local)" in r.stdout


def test_html_report(world: dict[str, Any], tmp_path: Path, on_cluster: list[str]) -> None:
    pytest.importorskip("plotly")
    out = tmp_path / "fleet.html"
    r = cli("fleet", "analyze", str(world["ds"]), *on_cluster, "-f", "html", "-o", str(out))
    assert r.returncode == 0, r.stderr
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and "11 traces" in page
    for heading in ("Top leaking jobs", "GPUs by fragmentation", "Flagged traces"):
        assert f"<h2>{heading}</h2>" in page
    assert "7 events dropped" in page and "status recording" in page


@pytest.mark.parametrize(("args", "needle"), [
    (["--where", "host = "], "--where: expression ends"),
    (["--where", "colour = red"], "unknown field 'colour'"),
    (["--where", "cmdline ~ '('"], "not a valid regular expression"),
    (["--where", "pid = x"], "pid takes an integer"),
    (["--format", "pdf"], "--format must be one of"),
    (["--workers", "0"], "--workers"),
    (["--scheduler", "tcp://127.0.0.1:9"], "cannot reach the Dask scheduler"),
])
def test_bad_options_are_one_line(world: dict[str, Any], args: list[str], needle: str) -> None:
    """Options refused before any Dask code runs are checked in this process; the
    unreachable scheduler, where Dask's client could add lines, in a subprocess."""
    run = gputrace if "--scheduler" in args else cli
    assert_one_line_error(run("fleet", "analyze", str(world["ds"]), *args), needle)
