"""Shared pytest options and fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import live_report
from tests.goldens import UPDATE_ENV, UPDATE_FLAG, update_requested

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        UPDATE_FLAG,
        "--update-golden",
        dest="update_goldens",
        action="store_true",
        default=False,
        help=f"rewrite golden files and snapshots instead of comparing against them "
        f"(or {UPDATE_ENV}=1); a missing golden fails without this",
    )


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return update_requested(request.config)


def pytest_configure(config: pytest.Config) -> None:
    live_report.configure(config)
