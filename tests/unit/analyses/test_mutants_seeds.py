"""Tests that kill the mutants of the analyses that survived the mutation samples of
seeds 4711 and 90210 (docs/testing.md, "Mutation testing"): each asserts an independent
truth, a value planted in a small hand-made input (synthetic) or a figure counted by
hand beside it, and names in its docstring what it pins. Grouped by module; fast and
in-process.
"""

from __future__ import annotations

import re

from gputrace import docblocks
from gputrace.analyses import catalog, fail_on, registry

DOCS = docblocks.ROOT / "docs"


# ------------------------------------------------------------------------- catalog
def _table(text: str) -> list[list[str]]:
    """The cells of a markdown table's rows (header and rule included)."""
    return [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in text.splitlines() if line.startswith("|")]


def test_reports_table_one_row_per_report_linking_its_page() -> None:
    """catalog.reports_table: a header, a rule, then one row per registered report in
    registry order with its `--only` name, JSON key, question, layers (or "none") and
    a link to its page, which exists; the committed docs/reports.md holds it."""
    text = catalog.reports_table()
    assert text.endswith("|\n") and not text.endswith("\n\n")
    head, rule, *rows = _table(text)
    assert head == ["report (`--only`)", "JSON key", "question", "trace layers read", "page"]
    assert rule == ["---"] * 5
    assert len(rows) == len(registry.REPORTS) > 5
    for row, spec in zip(rows, registry.REPORTS, strict=True):
        name, key, question, layers, page = row
        assert name == f"`{spec.name}`" and key == f"`{spec.key}`"
        assert question == spec.question.strip()
        want = [f"`{x}`" for x in spec.layers] or ["none"]
        assert layers.split(", ") == want
        link = re.fullmatch(r"\[(.+)\]\((analyses/.+\.md)\)", page)
        assert link is not None and link.group(1) == spec.name
        assert (DOCS / link.group(2)).is_file()
    assert text.rstrip("\n") in (DOCS / "reports.md").read_text()


def test_json_keys_table_a_key_per_report_then_the_documents_own() -> None:
    """catalog.json_keys_table: one row per report (its key, "object or null", its
    question and page), then `warnings` and `trace`; the committed
    docs/json-report.md holds it."""
    text = catalog.json_keys_table()
    assert text.endswith("|\n") and not text.endswith("\n\n")
    head, rule, *rows = _table(text)
    assert head == ["key", "type", "meaning"] and rule == ["---"] * 3
    assert len(rows) == len(registry.REPORTS) + 2
    for row, spec in zip(rows, registry.REPORTS, strict=False):
        assert row[:2] == [f"`{spec.key}`", "object or null"]
        assert row[2].startswith(spec.question)
        assert f"[analyses/{spec.name}.md](analyses/{spec.name}.md)" in row[2]
        assert row[2].endswith("`null` when `--only` left it out")
    assert [r[0] for r in rows[-2:]] == ["`warnings`", "`trace`"]
    assert rows[-2][1] == "list of strings" and rows[-1][1] == "object"
    assert "`duration_s`" in rows[-1][2] and "dropped" in rows[-2][2]
    assert text.rstrip("\n") in (DOCS / "json-report.md").read_text()


# ------------------------------------------------------------------------- fail_on
def test_fail_on_growth_hit_names_the_growing_pids() -> None:
    """fail_on.growth_hit: pids whose memory climbs fail the run, named; none do not."""
    assert fail_on.growth_hit({"growing_pids": [7, 9]}, 0.0) == (
        "growth: memory climbing in pid(s) [7, 9]")
    assert fail_on.growth_hit({"growing_pids": []}, 0.0) is None


def test_fail_on_oom_hit_counts_incidents_by_verdict() -> None:
    """fail_on.oom_hit: 3 incidents, 2 of one verdict and 1 of another, fail the run
    with each verdict's count in report order; no incident does not."""
    rep = {"count": 3, "by_verdict": [{"verdict": "fragmentation", "incidents": 2},
                                      {"verdict": "exhausted", "incidents": 1}]}
    assert fail_on.oom_hit(rep, 0.0) == (
        "oom: 3 out-of-memory incident(s) (2 fragmentation, 1 exhausted)")
    assert fail_on.oom_hit({"count": 0, "by_verdict": []}, 0.0) is None
