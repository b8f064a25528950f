"""The terminal report fits the terminal: at any width no line is longer than the
terminal, no table cell wraps (a number is never broken over lines), and columns that
do not fit are left out with a note naming them."""

from __future__ import annotations

import io

import pytest

from gputrace.render.terminal import render_terminal
from tests.analyze_helpers import analyze
from tests.conftest import FIXTURES

H200 = FIXTURES / "real-h200-cuda"


def text(width: int) -> str:
    buf = io.StringIO()
    render_terminal(analyze(H200), buf, color=False, width=width)
    return buf.getvalue()


@pytest.mark.parametrize("width", [60, 80, 100, 160])
def test_lines_fit_and_rows_stay_whole(width: int) -> None:
    out = text(width)
    lines = out.splitlines()
    assert max(len(x.rstrip()) for x in lines) <= width
    doc = analyze(H200)
    # every ioctl command row is one line: its name appears once per row, and a table
    # continuation line (starting with a blank first cell) never follows
    ioctls = doc["summary"]["ioctls"][:20]
    for r in ioctls:
        hit = [x for x in lines if f" {r['name']} " in x and x.startswith(r["device"])]
        assert len(hit) == 1, (r["name"], hit)
        assert f"{r['count']:,}" in hit[0].split("│")[3]
    assert not any(x.startswith("     │") for x in lines)


def test_narrow_terminal_names_left_out_columns() -> None:
    narrow, wide = text(80), text(160)
    part = narrow.split("ioctls (latency in µs)")[1].split("Memory per process")[0]
    assert "too narrow for: " in part and "max" in part.split("too narrow for: ")[1]
    # wide enough: every ioctl column is shown, nothing left out of that table
    ioctl_part = wide.split("ioctls (latency in µs)")[1].split("Memory per process")[0]
    assert "too narrow" not in ioctl_part and " max" in ioctl_part.splitlines()[1]
