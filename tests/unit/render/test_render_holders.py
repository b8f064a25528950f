"""The holders report's sections, and what the leak and oom sections show of it: verdict
lines, the held figure beside the per-layer breakdown, rows not listed, written as the
terminal writes them (1239, not 1,239; yes/no; never a Python dict, list or bool).
Synthetic documents, shaped as gputrace/analyses/holders and oom write them."""

from __future__ import annotations

import io
import re
from typing import Any

from rich.console import Console

from gputrace.analyses import registry
from gputrace.render import html_sections, terminal
from gputrace.render.holder_html import holders_html
from gputrace.render.holder_sections import holders_section
from gputrace.render.html import Page
from gputrace.render.oom_sections import oom_section

VERDICT = ("2 worker processes (pids 1240, 1241) forked from train (pid 1239) after it "
           "opened the GPU device files keep its memory alive: 1.2 GiB")


def _instant(at: str = "incident") -> dict[str, Any]:
    return {"at": at, "t_s": 2.5, "gpu_index": None, "orphaned_bytes": 3 << 30,
            "orphaned_pids": 2, "driver_accounting": True, "ts_ns": 2_500_000_000,
            "cases": [{"verdict": VERDICT, "orphaned": True}],
            "left_out": {"cases": 1234, "cases_bytes": 5 << 20, "holders": 7},
            "holders": [{"pid": 1240, "comm": "worker", "fds": 1234, "inherited": True,
                         "opened_by": [1239, 1300], "driver_bytes": 1 << 30}]}


def _body(page: Page) -> str:
    """The page's text, without its scripts (figure data)."""
    html = page.html()
    return re.sub(r"<script>.*?</script>", "", html[html.index("<body"):], flags=re.S)


def _con() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=100, no_color=True, force_terminal=False), out


def test_holders_terminal_and_html_write_the_same_figures() -> None:
    con, out = _con()
    holders_section(con, {"instants": [_instant()]}, 20)
    text = " ".join(out.getvalue().split())  # rich wraps long lines at spaces
    page = Page("t")
    holders_html(page, {"holders": {"question": "who?", "instants": [_instant()]}}, {})
    html = _body(page)
    for s in (text, html):
        assert "at the incident at 2.500 s (GPU unknown): memory no live process owns: 3.0 GiB" in s
        assert "1,234 more cases (5.0 MiB not listed" in s
        assert "7 more holders not listed" in s
        assert "1239, 1300" in s and "1,239" not in s and "1,240" not in s
    assert VERDICT in text and "1.0 GiB" in text and "1,234" in text
    assert "False" not in html and "True" not in html and "{'" not in html


def _incident(**extra: Any) -> dict[str, Any]:
    return {"pid": 1239, "comm": "train", "tid": 1239, "t_s": 2.5, "ts_ns": 1, "last_ts_ns": 1,
            "call": "cuMemAlloc_v2", "layer": "api", "requested_bytes": 1 << 30, "attempts": 1,
            "gpu_index": 0, "gpu": None, "verdict": "unknown", "evidence": "no sample",
            "allocator_pool_bytes": None, "nested": [], "stack": None,
            "holders": [{"pid": 1239, "comm": "train", "traced": True, "driver_bytes": None,
                         "held_bytes": 590 << 20, "api_bytes": 69 << 20, "rm_bytes": 588 << 20,
                         "uvm_bytes": 668 << 20, "grew_bytes": 0,
                         "allocator_reserved_bytes": None, "allocator_allocated_bytes": None,
                         "top_sites": [], "grew_sites": []}],
            "holders_left_out": {"count": 1500, "driver_bytes": 2 << 30, "held_bytes": 0},
            **extra}


def test_oom_shows_held_the_left_out_and_no_live_owner() -> None:
    con, out = _con()
    oom_section(con, {"count": 2, "failures": 2, "window_s": 30.0,
                      "by_verdict": [{"verdict": "unknown", "incidents": 2}],
                      "incidents": [_incident(no_live_owner=_instant()), _incident()]}, 1)
    text = " ".join(out.getvalue().split())
    assert "held" in text and "590.0 MiB" in text and "layer api" in text
    assert "per-layer breakdown" in text
    assert "1,500 more holders not listed (driver 2.0 GiB, held 0 B" in text
    assert "memory no live process owns: 3.0 GiB" in text and VERDICT in text
    assert "1 more incidents (use --rows" in text and "--top" not in text
    page = Page("t")
    html_sections.oom(page, {"oom": {"recorded": True, "window_s": 30.0,
                                     "incidents": [_incident(no_live_owner=_instant())]}}, {})
    html = _body(page)
    assert "590.0 MiB" in html and "layer uvm" in html and "1,500 more holders" in html
    assert "memory no live process owns: 3.0 GiB" in html


def test_generic_sections_never_write_a_python_value() -> None:
    """A report without sections of its own: flags yes/no, pids bare, nested values as
    text, in the terminal and the page alike."""
    spec = next(s for s in registry.REPORTS if s.key == "holders")
    rep = {"question": "q?", "recorded": True, "warnings": [], "not_recorded_layers": [],
           "flag": False, "owner_pid": 1239, "nested": {"cases": 2, "pids": [1239, 1240]},
           "rows": [{"pid": 1239, "inherited": True, "left_out": {"cases": 0}}]}
    con, out = _con()
    terminal.generic_section(con, spec, rep, 20)
    page = Page("t")
    html_sections.generic_section(page, spec, rep)
    for s in (out.getvalue(), _body(page)):
        for raw in ("False", "True", "{'", "[1239", "1,239"):
            assert raw not in s, (raw, s)
        assert "no" in s and "yes" in s and "cases 2, pids 1239, 1240" in s
