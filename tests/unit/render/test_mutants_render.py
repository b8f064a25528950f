"""Tests that kill the mutants of the renderers that survived the mutation sample
(docs/testing.md, "Mutation testing"): each renders a small hand-made report document
(synthetic values planted here) and asserts the text, cell or byte that must come
out, naming in its docstring what it pins. Grouped by module; fast and in-process.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import plotly.graph_objects as go  # type: ignore[import-untyped]
import pytest

from gputrace.analyses.diff import diff
from gputrace.analyses.helpers.inputs import inputs_from_trace
from gputrace.analyses.run import run_reports
from gputrace.analyses.timeseries import plot_series, timeline
from gputrace.render import cells, html
from gputrace.render import html_plots as plots
from gputrace.render.diff import render_diff_html, render_diff_terminal
from gputrace.render.html import Page
from gputrace.render.html_sections import sections
from gputrace.render.perfetto import render_perfetto
from gputrace.render.terminal import render_terminal
from gputrace.trace.builder import MiB, TraceBuilder
from gputrace.trace.reader import open_trace
from tests.analyze_helpers import SCENARIO_DIR


# ---------------------------------------------------------------------------- diff
def _doc(procs: list[dict[str, Any]], leaked: int) -> dict[str, Any]:
    return {"summary": {"processes": procs, "gpus": {"gpus": []}, "ioctls": []},
            "leaks": {"recorded": True, "total_bytes": leaked}, "fault_rate": {"rates": []}}


def _proc(comm: str, peak: int) -> dict[str, Any]:
    return {"layer": "api", "comm": comm, "peak_bytes": peak, "live_end_bytes": 5}


def _diff_doc() -> dict[str, Any]:
    """Two processes whose peaks rose (1 -> 3 MiB, 1000 B -> 2000 B); 160 -> 164 MiB
    leaked; one comm that looks like rich markup."""
    d = diff(_doc([_proc("[b]x[/b]", MiB), _proc("y", 1000)], 160 * MiB),
             _doc([_proc("[b]x[/b]", 3 * MiB), _proc("y", 2000)], 164 * MiB), [], [])
    d.update(before_trace="runs/a", after_trace="runs/b", warnings=["before: w1"])
    return d


def _terminal(d: dict[str, Any]) -> list[str]:
    buf = io.StringIO()
    render_diff_terminal(d, buf)
    return buf.getvalue().splitlines()


def _cells(lines: list[str], first: str) -> list[str]:
    row = next(ln for ln in lines if ln.startswith("│") and ln.split("│")[2].strip() == first)
    return row.split("│")[1:-1]


def test_diff_terminal_header_warning_and_leaked_bytes() -> None:
    """render_diff_terminal: the first line names both traces, then each warning, then
    the leaked bytes before -> after in binary units with the percentage."""
    lines = _terminal(_diff_doc())
    assert lines[:3] == ["gputrace diff: runs/a -> runs/b", "warning: before: w1",
                         "leaked bytes: 160.0 MiB -> 164.0 MiB (+2.5%)"]


def test_diff_terminal_cells_are_literal_and_numbers_right_aligned() -> None:
    """render_diff_terminal: a comm written like rich markup ("[b]x[/b]") is printed as
    it is, not interpreted; the figure columns are right-aligned (the shorter cell
    "1000 B -> 2.0 KiB" is padded on the left, "5 B" too)."""
    lines = _terminal(_diff_doc())
    x = _cells(lines, "[b]x[/b]")
    assert [c.strip() for c in x] == ["api", "[b]x[/b]", "grown",
                                     "1.0 MiB -> 3.0 MiB (+200.0%)", "5 B"]
    y = _cells(lines, "y")
    assert y[3].strip() == "1000 B -> 2.0 KiB (+100.0%)"
    assert y[3].startswith("  ") and y[3].endswith("%) ")
    assert y[4].endswith(" 5 B ") and y[4].startswith("  ")


def test_diff_html_leaked_bytes_in_binary_units() -> None:
    """render_diff_html: the leaked-bytes line is in binary units (160.0 MiB), not raw
    byte counts."""
    page = render_diff_html(_diff_doc())
    assert "<p>leaked bytes: 160.0 MiB -&gt; 164.0 MiB (+2.5%)</p>" in page


# ------------------------------------------------------------------------ terminal
def test_terminal_report_warnings_under_their_section_once() -> None:
    """render_terminal: a trace-level warning is printed once at the top; a report of
    layers the trace lacks is one line at the end, its own warning (an RM sample that
    failed) just before it."""
    doc = {"warnings": ["trace-level w"],
           "fragmentation": {"question": "q?", "warnings": ["trace-level w", "GPU 0 failed"],
                             "recorded": False, "not_recorded_layers": ["driver", "rm_query"]}}
    buf = io.StringIO()
    render_terminal(doc, buf, color=False)
    lines = buf.getvalue().splitlines()
    assert lines[0] == "warning: trace-level w"
    assert set(lines[1]) == {"─"}
    assert lines[2:] == ["warning: GPU 0 failed", "not recorded in this trace (layers "
                         "missing): Fragmentation (driver, rm_query)"]


# --------------------------------------------------------------------------- cells
def test_human_bytes_units_up_to_and_past_tib() -> None:
    """cells.human_bytes: whole bytes below 1 KiB, one decimal above; TiB is the last
    unit, so 2 PiB is written 2048.0 TiB (not the raw count); None is '-'."""
    assert cells.human_bytes(None) == "-"
    assert cells.human_bytes(1023) == "1023 B"
    assert cells.human_bytes(1024) == "1.0 KiB"
    assert cells.human_bytes(-3 * MiB // 2) == "-1.5 MiB"
    assert cells.human_bytes(5 * 1024**4) == "5.0 TiB"
    assert cells.human_bytes(2 * 1024**5) == "2048.0 TiB"


# ------------------------------------------------------------------- html_sections
_series_cache: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}


def _doc_and_series(scenario: str, reports: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """One synthetic scenario's report document and plot series."""
    if scenario not in _series_cache:
        inp = inputs_from_trace(open_trace(SCENARIO_DIR / scenario))
        doc = run_reports(inp, reports)
        _series_cache[scenario] = doc, plot_series(inp, doc)
    return _series_cache[scenario]


def _sections_html(scenario: str, reports: list[str]) -> str:
    """The HTML sections (no page shell) of one synthetic scenario's reports."""
    page = Page("t")
    sections(page, *_doc_and_series(scenario, reports))
    return "".join(page.parts)


def _html_table(h: str, after: str) -> tuple[list[str], list[list[str]]]:
    """Header cells and body rows of the first table after the text `after`."""
    t = h[h.index(after):].split("<table>", 1)[1].split("</table>")[0]
    head = re.findall(r"<th>(.*?)</th>", t)
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", r) for r in re.findall(r"<tr><td.*?</tr>", t)]
    return head, rows


def test_html_growth_fit_table_has_the_growing_process() -> None:
    """html_sections: the growth-fit table of training_leak (an 8 MiB cache leaked each
    second, 0.9 .. 19.9 s) lists pid 1000 (api) as growing, with its 19 rising troughs
    (20 leaks) over a span of 19.4 s (first event 0.5 s, last 19.9 s)."""
    head, rows = _html_table(_sections_html("training_leak", ["leaks", "summary"]),
                             "<h3>Growth fits</h3>")
    assert head == ["layer", "pid", "slope", "R²", "rising troughs", "span s", "growing"]
    ((layer, pid, slope, _, troughs, span, growing),) = rows
    # written as the terminal writes them: pid plain, the slope in bytes, yes/no
    assert (layer, pid, troughs, span, growing) == ("api", "1000", "19", "19.4", "yes")
    assert slope.endswith(" MiB/min")


def test_html_fault_batches_and_migrations_tables() -> None:
    """html_sections: uvm_storm's two fault batches on GPU 0 (5 + 5 faults, 5 + 1
    duplicates: share 0.6; service 200 and 400 us) and its migrations by cause and
    direction: 8 x 2 MiB ping-pong + 12 x 64 KiB demand paging CPU->GPU (20, 16.75
    MiB), 6 x 2 MiB back, 4 evictions of 2 MiB."""
    h = _sections_html("uvm_storm", ["fault-rate"])
    head, rows = _html_table(h, "<h3>Fault batches</h3>")
    assert head == ["GPU", "batches", "faults", "dup share", "service p50 ns",
                    "service max ns"]
    ((gpu, batches, faults, dup, _, svc_max),) = rows
    assert (gpu, batches, faults, dup, svc_max) == ("0", "2", "10", "0.6", "400,000")
    head, rows = _html_table(h, "<h3>Migrations by cause</h3>")
    assert head == ["cause", "direction", "migrations", "bytes"]
    assert rows == [["replayable_fault", "cpu-&gt;gpu0", "20", "16.8 MiB"],
                    ["replayable_fault", "gpu0-&gt;cpu", "6", "12.0 MiB"],
                    ["eviction", "gpu0-&gt;cpu", "4", "8.0 MiB"]]
    head, _ = _html_table(h, "<h2>Fault rate over time</h2>")
    assert head == ["pid", "GPU", "source", "access", "faults", "mean/s", "peak/s"]


def test_html_pmm_chunk_table_peak_and_end() -> None:
    """html_sections: two_gpus' PMM table: GPU 0 holds 512 root chunks of 2 MiB (1 GiB)
    and GPU 1 eight (16 MiB), at the peak and at the end."""
    head, rows = _html_table(_sections_html("two_gpus", ["fragmentation"]),
                             "<h3>PMM chunks (driver layer)</h3>")
    assert head == ["GPU", "peak used", "peak index", "end used", "end index"]
    assert [(r[0], r[1], r[3]) for r in rows] == [("0", "1.0 GiB", "1.0 GiB"),
                                                  ("1", "16.0 MiB", "16.0 MiB")]


# ------------------------------------------------------------------------- html
def test_html_escape_and_none() -> None:
    """html.esc: None is an empty cell; quotes and angle brackets are escaped."""
    assert html.esc(None) == ""
    assert html.esc('<a href="x">') == "&lt;a href=&quot;x&quot;&gt;"
    assert html.esc(0) == "0"


# ------------------------------------------------------------------- html_plots
def _valid(fig: dict[str, Any] | None) -> dict[str, Any]:
    """The figure, after plotly itself accepted every trace and layout property (an
    unknown key or an invalid value such as a dash style plotly lacks raises)."""
    assert fig is not None
    go.Figure(fig)
    return fig


def test_plotly_figures_of_the_fault_rates_are_valid_and_named() -> None:
    """html_plots.fault_rates: fault_rates' series (CPU writes of pid 8000, GPU faults,
    5 fault batches, migrations) are drawn as named traces plotly accepts, on a y axis
    that says the bucket (the report's 1 s window)."""
    _, s = _doc_and_series("fault_rates", ["fault-rate"])
    fig = _valid(plots.fault_rates(s["fault_rates"]))
    names = [d["name"] for d in fig["data"]]
    assert names == ["CPU faults", "GPU faults: gpu_replayable", "fault batches",
                     "migrations: replayable_fault"]
    assert fig["layout"]["yaxis"]["title"]["text"] == "per second (bucket 1 s)"
    assert fig["layout"]["title"]["text"] == "Fault rate over time"


def test_plotly_figures_of_live_and_gpu_bytes_and_latency_are_valid() -> None:
    """html_plots: live bytes (training_leak: pid 1000 with its growth fit), bytes per
    GPU (two_gpus: 1 GiB and 16 MiB) and ioctl latency (ioctl_latencies) are figures
    plotly accepts, each series named after what it draws."""
    _, s = _doc_and_series("training_leak", ["leaks", "summary"])
    fig = _valid(plots.live_bytes(s["live_bytes"]))
    assert [d["name"] for d in fig["data"]] == ["api train (1000)", "growth fit api pid 1000"]
    assert fig["data"][0]["line"] == {"shape": "hv", "dash": "solid"}
    _valid(plots.leak_icicle(s["leak_tree"]))
    _, s = _doc_and_series("two_gpus", ["fragmentation"])
    fig = _valid(plots.gpu_bytes(s["gpu_bytes"]))
    assert [max(d["y"]) for d in fig["data"]] == [1024 * MiB, 16 * MiB]
    _, s = _doc_and_series("ioctl_latencies", ["summary"])
    _valid(plots.latency(s["latency"]))


def test_plotly_fragmentation_figure_two_axes() -> None:
    """html_plots.fragmentation: per GPU the unusable share (left axis, 0..1) and the
    largest free region (right axis, bytes, titled), from hand-made RM samples."""
    rm = {"gpus": [{"gpu_index": 0, "series": [
        {"t_s": 0.0, "unusable_share_2m": 0.25, "largest_free_bytes": 6 * MiB},
        {"t_s": 1.0, "unusable_share_2m": 0.5, "largest_free_bytes": 4 * MiB}]}]}
    fig = _valid(plots.fragmentation(rm))
    share, largest = fig["data"]
    assert (share["name"], share["y"]) == ("GPU 0 unusable share (2 MiB)", [0.25, 0.5])
    assert (largest["name"], largest["yaxis"], largest["y"]) == (
        "GPU 0 largest free", "y2", [6 * MiB, 4 * MiB])
    lay = fig["layout"]
    assert lay["yaxis"]["range"] == [0, 1]
    assert lay["yaxis2"]["title"] == {"text": "largest free"}
    assert (lay["yaxis2"]["side"], lay["yaxis2"]["overlaying"]) == ("right", "y")
    assert plots.fragmentation(None) is None and plots.fragmentation({"gpus": []}) is None


# ------------------------------------------------------------------------ perfetto
def test_perfetto_process_named_after_the_process_not_its_thread(tmp_path: Path) -> None:
    """perfetto.render_perfetto: a process track is named after the process (trainer,
    pid 100) even when its only thread seen (tid 101) is named otherwise (loader); a
    pid without a process row is named after its thread (worker, pid 200)."""
    pb = pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")
    b = TraceBuilder(layers=("syscall",), duration_s=1.0)
    b.process(100, "trainer")
    b.ioctl(0.1, 100, "RM_CONTROL", tid=101, comm="loader")
    b.ioctl(0.2, 200, "RM_CONTROL", tid=200, comm="worker")
    inp = inputs_from_trace(open_trace(b.build(tmp_path / "t")))
    buf = io.BytesIO()
    render_perfetto(timeline(inp), buf)
    t = pb.Trace()
    t.ParseFromString(buf.getvalue())
    names = {p.track_descriptor.process.pid: p.track_descriptor.process.process_name
             for p in t.packet if p.track_descriptor.HasField("process")}
    threads = {p.track_descriptor.thread.tid: p.track_descriptor.thread.thread_name
               for p in t.packet if p.track_descriptor.HasField("thread")}
    assert names == {100: "trainer", 200: "worker"}
    assert threads == {101: "loader", 200: "worker"}
