"""`--format folded`: leaked (or, with --allocated, allocated) bytes by call stack, one
line per stack, for flamegraph.pl and speedscope."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gputrace.cli import main
from gputrace.render.folded import render_folded
from tests.analyze_helpers import analyze
from tests.conftest import FIXTURES

TRACES = sorted(p.parent for p in FIXTURES.rglob("manifest.json"))
LINE = re.compile(r"^[^\n]+ \d+$")


def folded(trace: Path, capsys: pytest.CaptureFixture[str], *more: str) -> list[str]:
    assert main(["analyze", str(trace), "--format", "folded", *more]) == 0
    return capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_fixture_folds(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for line in folded(trace, capsys) + folded(trace, capsys, "--allocated"):
        assert LINE.match(line), line
        assert line.split(";")[0] in ("api", "rm", "uvm")


def test_api_leak_fixture_names_the_leaking_function(
        capsys: pytest.CaptureFixture[str]) -> None:
    # standin-cuda: leak_buffers leaks 23 x 1 MiB through cuMemAlloc_v2 (EXPECTED.json)
    lines = [x for x in folded(FIXTURES / "standin-cuda", capsys) if x.startswith("api;")]
    assert len(lines) == 1
    stack, nbytes = lines[0].rsplit(" ", 1)
    assert stack.endswith(";main;leak_buffers") and int(nbytes) == 24_117_248  # 23 MiB


def total(lines: list[str]) -> int:
    return sum(int(x.rsplit(" ", 1)[1]) for x in lines)


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_folded_total_is_the_leak_headline(trace: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    # folded reads the joined allocations model: each piece once, in API bytes, and the
    # context memory the driver releases at exit is not a leak
    headline = analyze(trace)["leaks"]["total_bytes"]  # None: no memory layer recorded
    assert total(folded(trace, capsys)) == (headline or 0)


def test_real_h200_folds_the_six_leaked_allocations(
        capsys: pytest.CaptureFixture[str]) -> None:
    # TRUTH.json: 6 leaked cuMemAlloc of 72,351,744 bytes, not the 670 MiB of driver
    # context memory released at exit (which the per-layer count used to add)
    lines = folded(FIXTURES / "real-h200-cuda", capsys)
    assert total(lines) == 72_351_744
    assert all(x.startswith("api;") for x in lines)
    assert total(folded(FIXTURES / "real-h200-cuda", capsys, "--allocated")) > 72_351_744


def test_default_fixture_leaks_and_allocations(capsys: pytest.CaptureFixture[str]) -> None:
    lines = folded(FIXTURES / "default", capsys)
    assert "api;train.py (4242);main;train_step;log_metrics 10485760" in lines
    assert "api;preprocess (4300);main;load_dataset 268435456" in lines
    alloc = folded(FIXTURES / "default", capsys, "--allocated")
    total = {x.rsplit(" ", 1)[0]: int(x.rsplit(" ", 1)[1]) for x in alloc}
    # 20 allocations from log_metrics and train_step in all; more than what leaked
    assert sum(v for k, v in total.items() if k.startswith("api;train.py")) > 10485760


def test_frames_cannot_split_or_escape() -> None:
    rows = [{"layer": "api", "pid": 1, "comm": "a;b", "frames": ["main", "f;g\x1b[2J"],
             "bytes": 5, "count": 1}]
    assert render_folded(rows) == "api;a:b (1);main;f:g\\x1b[2J 5\n"
