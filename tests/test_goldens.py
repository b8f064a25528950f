"""Goldens never write themselves: a missing golden fails and names the flag that
regenerates it; only the explicit flag writes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.goldens import UPDATE_ENV, UPDATE_FLAG, check_text


def test_missing_golden_fails_and_names_the_flag(tmp_path: Path) -> None:
    golden = tmp_path / "gone.json"
    with pytest.raises(pytest.fail.Exception, match=UPDATE_FLAG) as e:
        check_text(golden, "{}\n", update=False)
    assert UPDATE_ENV in str(e.value)
    assert not golden.exists(), "a plain run must not write the golden"


def test_changed_output_fails_with_a_diff(tmp_path: Path) -> None:
    golden = tmp_path / "g.json"
    golden.write_text('{"bytes": 1}\n')
    with pytest.raises(pytest.fail.Exception, match=r'\+\{"bytes": 2\}'):
        check_text(golden, '{"bytes": 2}\n', update=False)
    check_text(golden, '{"bytes": 1}\n', update=False)


def test_update_writes_only_when_asked(tmp_path: Path) -> None:
    golden = tmp_path / "sub" / "g.txt"
    check_text(golden, "new\n", update=True)
    assert golden.read_text() == "new\n"


def test_deleting_a_committed_golden_fails_its_test(tmp_path: Path) -> None:
    """Run the real golden test of one scenario against a copy of tests/golden with
    that golden deleted (GOLDEN pointed at the copy): the test fails, names the flag,
    and writes nothing."""
    import shutil

    gold = tmp_path / "golden"
    shutil.copytree(ROOT / "tests" / "golden", gold)
    (gold / "analyze_two_gpus" / "leaks.json").unlink()
    code = (
        "import sys, pytest, tests.analyze_helpers as h;"
        "import tests.scenarios.test_analyze_scenarios as t;"
        f"h.GOLDEN = t.GOLDEN = __import__('pathlib').Path({str(gold)!r});"
        "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', "
        "'tests/scenarios/test_analyze_scenarios.py::test_golden_json[two_gpus-leaks]']))"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, env=_env_without_update())
    assert r.returncode == 1, r.stdout + r.stderr
    assert "leaks.json is missing" in r.stdout and UPDATE_FLAG in r.stdout
    assert not (gold / "analyze_two_gpus" / "leaks.json").exists()


def _env_without_update() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != UPDATE_ENV}
