"""The HTML report: every bundled fixture renders to one self-contained page; the page
opens in headless Debian chromium (installed by scripts/setup.sh --dev) with every plot drawn
and no console message; absent layers say "not recorded"; host text is escaped; plot
series are downsampled by the min/max rule."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import polars as pl
import pytest

from gputrace.analyses.helpers.inputs import Inputs
from gputrace.analyses.timeseries import plot_series
from gputrace.analyses.timeseries.downsample import decimate
from gputrace.cli import main
from gputrace.trace.builder import MiB, TraceBuilder
from tests.conftest import FIXTURES

TRACES = sorted(p.parent for p in FIXTURES.rglob("manifest.json"))
CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--enable-logging=stderr", "--v=0", "--virtual-time-budget=15000",
         "--window-size=1280,4400"]


def html_of(trace: Path, tmp: Path) -> str:
    out = tmp / "report.html"
    assert main(["analyze", str(trace), "--format", "html", "-o", str(out)]) == 0
    return out.read_text(encoding="utf-8")


def test_fixtures_are_found() -> None:
    assert len(TRACES) >= 15
    assert FIXTURES / "default" in TRACES


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_fixture_renders_self_contained(trace: Path, tmp_path: Path) -> None:
    page = html_of(trace, tmp_path)
    assert page.startswith("<!DOCTYPE html>")
    # no external resource of any kind: plotly is inlined, and the CSP forbids fetching
    assert not re.search(r"<(script|link|img|iframe)[^>]*\s(src|href)=", page)
    assert "default-src 'none'" in page
    assert "Plotly.newPlot" in page and "plotly.js" in page[:200_000]
    n = int(re.search(r"data-plots=(\d+)", page).group(1))  # type: ignore[union-attr]
    assert page.count('<div class="plot" id="plot') == n
    # each section is drawn, or its report is named in the one line of absent layers
    absent = re.search(r'<p class="nr">not recorded in this trace \(layers missing\): '
                       r'([^<]*)</p>', page)
    for title, report in (("Live bytes over time", "Leaks"), ("Bytes in use per GPU", "Summary"),
                          ("Fault rate over time", "Fault rate"),
                          ("Fragmentation over time", "Fragmentation"),
                          ("Top leak sites", "Leaks"), ("ioctl latency per command", "Summary")):
        assert (title in page) != bool(absent and f"{report} (" in absent.group(1)), title
    assert len(page) < 8 * MiB


def test_absent_layers_say_not_recorded(tmp_path: Path) -> None:
    """training_leak (syscall, api): the fault-rate, fragmentation and allocator reports
    are one line at the end, not sections saying "not recorded"; the leak and summary
    sections are drawn."""
    page = html_of(FIXTURES / "scenarios" / "training_leak", tmp_path)
    assert page.count('class="nr"') == 1
    assert ('<p class="nr">not recorded in this trace (layers missing): Fault rate '
            "(cpu_faults, driver, uvm_tools); Fragmentation (driver, rm_query); Tensors "
            "alive (PyTorch) (allocator); PyTorch allocator pool (allocator); PyTorch "
            "allocator growth (allocator)</p>") in page
    assert "Fault rate over time" not in page and '"name":"CPU faults"' not in page
    assert "Live bytes over time" in page and "Top leak sites" in page


def test_header_and_drops_warning(tmp_path: Path) -> None:
    b = TraceBuilder(layers=("syscall", "api"), duration_s=2.0)
    b.process(7, "</script><b>x</b>")
    b.cuda_alloc(0.5, 7, 1 * MiB, stack=["<img src=x onerror=alert(1)>", "main"])
    path = b.build(tmp_path / "t", force=True)
    manifest = path / "manifest.json"
    import json
    m = json.loads(manifest.read_text())
    m["drops"] = {"api": 5}
    manifest.write_text(json.dumps(m))
    page = html_of(path, tmp_path)
    assert "Events were lost" in page and "api=5" in page
    assert "synthetic" in page and "SYNTHETIC" in page
    assert "</script><b>" not in page and "<img src=x" not in page
    assert "&lt;/script&gt;&lt;b&gt;x&lt;/b&gt;" in page
    # inside the figure JSON: the name as Plotly text (entities), its `&` escaped by the
    # JSON, and the hover template's own markup with `<` escaped too
    assert "\\u0026lt;/script\\u0026gt;" in page
    assert "\\u003cbr\\u003e%{value:,} bytes" in page


def test_downsampling_keeps_extremes_and_bounds_points() -> None:
    n = 200_000
    ts = list(range(0, n * 1000, 1000))
    vals = [(i * 7919) % 10_007 for i in range(n)]
    vals[123_456] = 10**9  # one spike must survive
    inp = Inputs(tables={}, layers=(), start_ns=0, end_ns=ts[-1])
    df = decimate(pl.LazyFrame({"k": [1] * n, "ts_ns": ts, "v": vals}), ["k"], "v", inp, 100)
    assert df.height <= 200
    assert df["v"].max() == 10**9 and df["v"].min() == 0
    assert df.filter(pl.col("v") == 10**9)["ts_ns"].to_list() == [123_456_000]
    assert df["ts_ns"].is_sorted()


def test_plot_series_of_training_leak_are_exact() -> None:
    from gputrace.analyses.helpers.inputs import inputs_from_trace
    from gputrace.trace.reader import open_trace
    from tests.analyze_helpers import analyze

    path = FIXTURES / "scenarios" / "training_leak"
    s = plot_series(inputs_from_trace(open_trace(path)), analyze(path))
    (live,) = s["live_bytes"]["series"]
    assert live["peak"] == (256 + 19 * 8) * MiB and live["end"] == 160 * MiB
    (fit,) = s["live_bytes"]["fits"]
    assert fit["layer"] == "api" and fit["pid"] == 1000
    assert fit["slope_bytes_per_min"] == pytest.approx(480 * MiB, rel=0.05)
    assert s["leak_stacks"][0]["frames"] == ["main", "train_step", "cache_grad"]
    assert s["leak_stacks"][0]["bytes"] == 160 * MiB
    assert s["fault_rates"]["cpu_faults"] == {"recorded": False, "series": []}


@pytest.mark.parametrize("name", ["real-h200-cuda", "standin-cuda"])
def test_leak_icicle_totals_the_leak_headline(name: str) -> None:
    from gputrace.analyses.helpers.inputs import inputs_from_trace
    from gputrace.trace.reader import open_trace
    from tests.analyze_helpers import analyze

    doc = analyze(FIXTURES / name)
    tree = plot_series(inputs_from_trace(open_trace(FIXTURES / name)), doc)["leak_tree"]
    roots = sum(v for v, p in zip(tree["values"], tree["parents"], strict=True) if not p)
    # real H200: 6 leaked cuMemAlloc (TRUTH.json); stand-in: leak_buffers' 23 x 1 MiB
    assert roots == doc["leaks"]["total_bytes"] == {"real-h200-cuda": 72_351_744,
                                                    "standin-cuda": 24_117_248}[name]


def test_icicle_keeps_the_total_past_its_stack_limit() -> None:
    from gputrace.analyses.timeseries.stacks_by_bytes import icicle

    rows = [{"layer": "api", "pid": 1, "comm": "a", "frames": ["main", f"f{i}"],
             "bytes": 10 + i, "count": 1} for i in range(5)]
    tree = icicle(rows, most=2)
    assert tree["values"][tree["ids"].index("/0:api")] == sum(10 + i for i in range(5))
    assert "3 other stacks" in tree["labels"]


def _chromium(args: list[str], tmp: Path) -> subprocess.CompletedProcess[str]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail("chromium is missing: scripts/setup.sh --dev installs Debian's")
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp / 'profile'}", *args],
                          capture_output=True, text=True, timeout=180, check=False)


BROWSER = [FIXTURES / "default", FIXTURES / "scenarios" / "training_leak",
           FIXTURES / "real-h200-uvm" / "trace", FIXTURES / "scenarios" / "fragmented_gpu"]


@pytest.mark.parametrize("trace", BROWSER, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_page_renders_in_chromium(trace: Path, tmp_path: Path) -> None:
    page = html_of(trace, tmp_path)
    expected = int(re.search(r"data-plots=(\d+)", page).group(1))  # type: ignore[union-attr]
    assert expected >= 1
    r = _chromium(["--dump-dom", (tmp_path / "report.html").as_uri()], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    console = [line for line in r.stderr.splitlines() if ":CONSOLE" in line]
    assert console == []
    dom = r.stdout
    assert f'data-plots-rendered="{expected}"' in dom
    # every plot div became a plotly plot with its SVG drawn
    assert len(re.findall(r'class="plot js-plotly-plot"', dom)) == expected
    assert dom.count('class="main-svg"') >= expected


def test_screenshot(tmp_path: Path) -> None:
    html_of(FIXTURES / "default", tmp_path)
    shot = tmp_path / "shot.png"
    r = _chromium([f"--screenshot={shot}", (tmp_path / "report.html").as_uri()], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert [line for line in r.stderr.splitlines() if ":CONSOLE" in line] == []
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 50_000
    keep = os.environ.get("GPUTRACE_KEEP_SCREENSHOT")
    if keep:
        shutil.copy(shot, keep)
