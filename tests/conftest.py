"""Shared pytest options and fixtures."""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Iterator
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
    config.addinivalue_line(
        "markers",
        "exclusive: runs with no other test of the session at the same time (pytest-xdist "
        "workers wait): for tests whose exact result depends on having the CPUs to "
        "themselves, such as a recording that must keep up with an ioctl storm",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist, the modules holding live tests first (each module kept whole,
    in its own order): each recording takes tens of seconds, most pure tests well under
    one, so the pure ones fill the workers' last minutes instead of one long recording
    running alone at the end. Every worker sorts alike, as xdist requires."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return
    live = {item.path for item in items if item.get_closest_marker("live") is not None}
    items.sort(key=lambda item: item.path not in live)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[object]:
    """Under pytest-xdist, every test holds a shared lock on one file of the session and
    a test marked `exclusive` an exclusive one: it starts when no other worker is inside
    a test, and none starts until it ends. The lock is held over the whole protocol
    (set-up, call, tear-down), so the module and session fixtures a test sets up or
    tears down (shared recordings, tests/live/conftest.py) are inside it too: a function
    fixture would take it only after those. Without workers it does nothing."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return (yield)
    # each worker's basetemp is <the session's basetemp>/popen-gwN: the parent is shared
    factory: pytest.TempPathFactory = item.config._tmp_path_factory  # type: ignore[attr-defined]
    path = factory.getbasetemp().parent / "gputrace-exclusive.lock"
    exclusive = item.get_closest_marker("exclusive") is not None
    # flock lets a new shared holder in while an exclusive one waits, so a worker running
    # test after test would starve it (the other worker idle for the rest of the run):
    # every test passes a gate first, which a waiting exclusive test holds shut
    with path.with_suffix(".gate").open("a") as gate, path.open("a") as f:
        fcntl.flock(gate, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        fcntl.flock(f, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        fcntl.flock(gate, fcntl.LOCK_UN)
        return (yield)


@pytest.fixture(scope="module")
def dask_scheduler() -> Iterator[str]:
    """The address of one local Dask cluster per test module (2 single-threaded worker
    processes, as `fleet analyze --workers 2` starts), for fleet tests that are not about
    starting a cluster: `fleet analyze --scheduler ADDRESS` saves each run the cluster's
    start and its workers' imports. Its workers start when the module's first test asks
    for it (environment variables set later, such as credentials, do not reach them) and
    stop after its last: idle, they still poll (a few per cent of a core each)."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(  # type: ignore[no-untyped-call]
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
            scheduler_kwargs={"dashboard": False, "dashboard_address": "127.0.0.1:0"},
            silence_logs=logging.CRITICAL) as cluster:  # fmt: skip
        yield str(cluster.scheduler_address)
