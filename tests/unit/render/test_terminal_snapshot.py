"""The terminal report of every bundled fixture, compared exactly with a text snapshot
(tests/snapshots/<fixture>/<report key>.txt, one per report, and the trace's warnings in
`_warnings.txt`; only `pytest --update-goldens` rewrites them), and
table cells asserted by value: the right number in the right column of the right
row, not just headers. Untrusted text (comm, symbols) never reaches the terminal raw.
"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gputrace.render.terminal import render_terminal
from tests.analyze_helpers import SCENARIO_DIR, analyze, scenarios
from tests.conftest import FIXTURES, ROOT
from tests.goldens import WARNINGS, check_text, joined_text, report_keys, stale_files

SNAPSHOTS = Path(__file__).resolve().parents[2] / "snapshots"
BUNDLED = ["default", "standin-rm", "standin-cuda", "standin-faults", "real-h200-cuda"]
TRACES = {n: FIXTURES / n for n in BUNDLED} | {
    f"scenario-{n}": SCENARIO_DIR / n for n in scenarios().SCENARIOS}


def render_doc(doc: dict[str, Any], by_layer: bool = False) -> str:
    buf = io.StringIO()
    render_terminal(doc, buf, color=False, by_layer=by_layer)
    return buf.getvalue()


def render(path: Path, by_layer: bool = False, **opts: Any) -> str:
    return render_doc(analyze(path, **opts), by_layer)


_docs: dict[str, dict[str, Any]] = {}
WHOLE = "default"
"""The one fixture whose whole terminal text is a snapshot too (how the sections join)."""


def doc_of(name: str) -> dict[str, Any]:
    if name not in _docs:
        _docs[name] = analyze(TRACES[name])
    return _docs[name]


def text_of(name: str) -> str:
    return render_doc(doc_of(name))


def sections_of(name: str) -> dict[str, str]:
    """The terminal text of fixture `name` cut into its per-report snapshots: the trace's
    warnings (printed first), then each report's section rendered alone."""
    doc, keys = doc_of(name), report_keys()
    head = render_doc({**doc, **dict.fromkeys(keys)})
    out = {WARNINGS: head}
    for k in keys:
        text = render_doc({**doc, **{o: None for o in keys if o != k}})
        assert text.startswith(head), k
        out[k] = text[len(head):]
    return out


def table(text: str, title: str) -> list[list[str]]:
    """Body rows (cells stripped) of the table headed `title` in rendered text."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.strip().startswith(title))
    rule = next(i for i in range(start, len(lines)) if lines[i].startswith("━"))
    rows = []
    for ln in lines[rule + 1:]:  # after the title, the (wrapped) header and its rule
        if "│" not in ln:
            break
        rows.append([c.strip() for c in ln.split("│")])
    return rows


@pytest.mark.parametrize("part", [WARNINGS, *report_keys()])
@pytest.mark.parametrize("name", sorted(TRACES))
def test_terminal_snapshot(name: str, part: str, update_golden: bool) -> None:
    """Each report's terminal section, per fixture, in a snapshot of its own."""
    check_text(SNAPSHOTS / name / f"{part}.txt", sections_of(name)[part], update_golden)


def test_whole_terminal_snapshot(update_golden: bool) -> None:
    check_text(SNAPSHOTS / f"{WHOLE}.txt", text_of(WHOLE), update_golden)


@pytest.mark.parametrize("name", sorted(TRACES))
def test_sections_join_into_the_whole_text(name: str) -> None:
    """Each recorded report's section rendered alone, in registry order after the
    warnings, then the one line that stands for every report whose layers the trace
    lacks, is the whole document's text; and the committed snapshots join into the
    whole one (they were cut from it) where every report was recorded."""
    doc, keys, parts = doc_of(name), report_keys(), sections_of(name)
    absent = [k for k in keys if doc.get(k) is not None and not doc[k]["recorded"]]
    tail = render_doc({**doc, **{o: None for o in keys if o not in absent}})
    tail = tail[len(parts[WARNINGS]):]
    assert absent == [] or tail.rstrip().endswith(")")  # the one line, all of them in it
    recorded = [k for k in keys if k not in absent]
    assert parts[WARNINGS] + "".join(parts[k] for k in recorded) + tail == text_of(name)
    if name == WHOLE and not absent:
        assert joined_text(SNAPSHOTS / WHOLE) == (SNAPSHOTS / f"{WHOLE}.txt").read_text()


def test_no_snapshot_of_an_unregistered_report() -> None:
    for name in TRACES:
        assert stale_files(SNAPSHOTS / name, [WARNINGS, *report_keys()]) == [], name


def test_cli_prints_the_same_text(tmp_path: Path) -> None:
    out = tmp_path / "report.txt"
    r = subprocess.run([sys.executable, "-m", "gputrace.cli", "analyze",
                        str(TRACES["scenario-exit_holding"]), "-o", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert out.read_text() == text_of("scenario-exit_holding")


def test_leaks_table_cells() -> None:
    sites = table(text_of("scenario-exit_holding"), "Leak sites")
    assert [r[:5] for r in sites] == [["2000", "worker", "cuMemAlloc", "1", "64.0 MiB"],
                                      ["2001", "server", "vidmem 0x40", "1", "16.0 MiB"]]
    rows = table(render(TRACES["scenario-exit_holding"], by_layer=True), "Leaked allocations")
    assert rows[0][:7] == ["api", "2000", "worker", "at exit", "cuMemAlloc",
                           "0x7f0000000000", "64.0 MiB"]
    assert [[*r[:3], r[6]] for r in rows] == [
        ["api", "2000", "worker", "64.0 MiB"], ["rm", "2000", "worker", "32.0 MiB"],
        ["rm", "2001", "server", "16.0 MiB"]]
    assert [r[3] for r in rows] == ["at exit", "at exit", "alive"]


def test_real_h200_leak_rows() -> None:
    joined = text_of("real-h200-cuda")
    assert "leaked: 69.0 MiB (72,351,744 bytes of API allocations) in 6 allocations" in joined
    sites = [r[3:5] for r in table(joined, "Leak sites") if r[0]]  # wrapped stacks: r[0] ""
    assert sites == [["1", "64.0 MiB"], ["5", "5.0 MiB"]]
    assert "5 \N{MULTIPLICATION SIGN} 1.0 MiB API allocations inside 3" in joined
    assert "released by \nthe driver at exit: 49 allocations" in joined
    text = render(TRACES["real-h200-cuda"], by_layer=True)
    api = [r for r in table(text, "Leaked allocations") if r[0] == "api"]
    assert [(r[1], r[2], r[3], r[6]) for r in api][:1] == [
        ("1239", "gpu_workload", "at exit", "64.0 MiB")]
    procs = [r for r in table(text, "By process") if r[0] == "api"]
    # 6 leaks, 72,351,744 bytes = 69.0 MiB
    assert procs == [["api", "1239", "gpu_workload", "unfreed_at_exit", "6", "69.0 MiB"]]


def test_ioctl_latency_cells() -> None:
    rows = {(r[0], r[1], r[2]): r[3:] for r in table(text_of("scenario-ioctl_latencies"),
                                                     "ioctls (latency in µs)")}
    # count, failed, total, p50, p90, p99, max (µs)
    assert rows[("ctl", "-", "RM_CONTROL")] == ["101", "7", "5,151.0", "51.0", "91.0",
                                                "100.0", "101.0"]
    assert rows[("gpu", "1", "RM_ALLOC_MEMORY")][:1] + rows[("gpu", "1",
                                                             "RM_ALLOC_MEMORY")][3:] == [
        "5", "30.0", "50.0", "50.0", "50.0"]
    assert rows[("gpu", "0", "RM_ALLOC_MEMORY")][0] == "5"
    assert rows[("uvm", "-", "UVM_MIGRATE")][:2] == ["10", "2"]


def test_memory_per_process_and_gpu_cells() -> None:
    text = text_of("scenario-memory_by_process")
    procs = {(r[0], r[1]): r[2:] for r in table(text, "Memory per process by layer")}
    assert procs[("api", "7100")] == ["alpha", "3", "30.0 MiB", "25.0 MiB"]
    assert procs[("rm", "7102")] == ["gamma", "3", "60.0 MiB", "30.0 MiB"]
    held = {r[0]: r[1:5] for r in table(text, "Memory per process (each piece once)")}
    assert held["7100"] == ["alpha", "30.0 MiB", "25.0 MiB", "25.0 MiB"]
    assert held["7102"] == ["gamma", "60.0 MiB", "30.0 MiB", "0 B"]
    gpus = table(text, "Memory per GPU")
    assert [(r[0], r[1], r[2]) for r in gpus] == [
        ("0", "30.0 MiB", "0 B"), ("1", "10.0 MiB", "10.0 MiB"), ("2", "20.0 MiB", "20.0 MiB")]
    assert "1.5" in text and "2.0" in text


def test_thrashing_row_cells() -> None:
    rows = table(text_of("scenario-fault_rates"), "Thrashing")
    assert len(rows) == 1
    assert "0x7d0000000000" in rows[0] and "3" in rows[0]


def test_untrusted_text_is_escaped(tmp_path: Path) -> None:
    """A comm with ESC/OSC sequences (any process can set its own) prints escaped."""
    from gputrace.trace.builder import MiB, TraceBuilder

    evil = "x\x1b]0;pwned\x07\x1b[2J"
    b = TraceBuilder(layers=("syscall", "api"), duration_s=2.0)
    b.process(77, evil)
    b.cuda_alloc(1.0, 77, MiB, stack=["bad\x1b[31mframe", "main"])
    text = render(b.build(tmp_path / "t"))
    assert "\x1b" not in text and "\x07" not in text
    row = next(r for r in table(text, "Leak sites") if r[0] == "77")
    assert row[1].startswith("x") and "pwned" in row[1] and row[1] != evil
    row = next(r for r in table(render(b.build(tmp_path / "t", force=True), by_layer=True),
                                "Leaked allocations") if r[1] == "77")
    assert row[2].startswith("x") and "pwned" in row[2] and row[2] != evil
