"""The polars scan setting the ioctl summary runs under is restored afterwards, and a value
the user set is left alone."""

from __future__ import annotations

import os

import pytest

from gputrace.analyses.helpers.scans import PREFETCH, few_row_groups_ahead


def test_set_only_inside_and_removed_after(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PREFETCH, raising=False)
    with few_row_groups_ahead():
        assert os.environ[PREFETCH] == "1"
    assert PREFETCH not in os.environ


def test_removed_after_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PREFETCH, raising=False)
    with pytest.raises(RuntimeError), few_row_groups_ahead():
        raise RuntimeError("query failed")
    assert PREFETCH not in os.environ


def test_the_users_value_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PREFETCH, "8")
    with few_row_groups_ahead():
        assert os.environ[PREFETCH] == "8"
    assert os.environ[PREFETCH] == "8"
