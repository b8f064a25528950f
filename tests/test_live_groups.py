"""A recording that a module- or session-scoped fixture makes is made by one worker.

Under `--dist loadgroup` (pyproject's addopts) the tests of a module go to any worker,
and each worker sets up the module's fixtures for itself: a fixture that records would
record once per worker, at the same time, and two copies of one fixture that makes
host state (cgroups, mounts) would remove it under each other. A live module whose
wide-scoped fixture starts a recorder therefore carries `pytest.mark.xdist_group`
(docs/testing.md, "What is shared"). The check reads the source; it also runs on a
planted violation, so it cannot pass vacuously."""

from __future__ import annotations

import ast
from pathlib import Path

LIVE = Path(__file__).resolve().parent / "live"
RECORDS = {"RecorderProc", "record_cmd", "SharedRecording"}
"""Names whose use inside a fixture means it starts a recording."""


def _wide_fixture(node: ast.FunctionDef) -> bool:
    for dec in node.decorator_list:
        if isinstance(dec, ast.Call) and ast.unparse(dec.func).endswith("fixture"):
            for kw in dec.keywords:
                if kw.arg == "scope" and isinstance(kw.value, ast.Constant) and \
                        kw.value.value in ("module", "session", "package"):
                    return True
    return False


def ungrouped_recording_fixtures(source: str) -> list[str]:
    """The wide-scoped fixtures of a test module that record, when the module has no
    xdist_group mark anywhere (its own or one on its tests)."""
    tree = ast.parse(source)
    if "xdist_group" in {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}:
        return []
    return [node.name for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef) and _wide_fixture(node)
            and RECORDS & {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}]


def test_every_wide_recording_fixture_is_in_one_group() -> None:
    found = {p.name: bad for p in sorted(LIVE.glob("test_*.py"))
             if (bad := ungrouped_recording_fixtures(p.read_text()))}
    assert found == {}


def test_the_check_sees_a_planted_violation() -> None:
    planted = ("import pytest\n@pytest.fixture(scope='module')\n"
               "def rec():\n    RecorderProc(record_cmd('t'))\n")
    assert ungrouped_recording_fixtures(planted) == ["rec"]
    grouped = "pytestmark = pytest.mark.xdist_group('g')\n" + planted
    assert ungrouped_recording_fixtures(grouped) == []
    narrow = planted.replace("(scope='module')", "")
    assert ungrouped_recording_fixtures(narrow) == []
    assert len(list(LIVE.glob("test_*.py"))) > 20  # the real suite was read
