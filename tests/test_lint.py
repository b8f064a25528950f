"""ruff and mypy --strict are part of the suite, so CI enforces them."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT

NO_RUFF = "ruff not installed: pip install -e .[dev]"


@pytest.mark.skipif(shutil.which("ruff") is None, reason=NO_RUFF)
def test_ruff_clean() -> None:
    r = subprocess.run(["ruff", "check", "gputrace", "tests"], cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_strict_clean() -> None:
    pytest.importorskip("mypy")
    r = subprocess.run([sys.executable, "-m", "mypy", "--strict", "gputrace"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
