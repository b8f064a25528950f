"""Which tests marked `live` the suite defines, which of them ran, and how.

CI must not go green when the live tests (real BPF recording, the FUSE stand-in
driver) skip because a host lacks root, bcc, headers or FUSE. With the environment
variable GPUTRACE_LIVE_REPORT naming a file, this plugin (enabled by
tests/conftest.py) writes there, at the end of the session::

    {"defined": [nodeid, ...],    # live items collected, before -m/-k deselection
     "selected": [nodeid, ...],   # live items left to run after deselection
     "outcomes": {nodeid: "passed" | "failed" | "skipped" | "xfailed" | "xpassed"}}

`python3 -m tests.live_report REPORT` (run by .ci/run) exits 1, naming each
problem, when no live test is defined, when any defined live test did not run
or was skipped, or when fewer ran than are defined.

Under pytest-xdist (`-n N`) the controller collects nothing: each worker sends its
`defined` and `selected` lists back with its results (`workeroutput`), the controller
sees every test report as the workers send them, and only the controller writes the
file, merged from all workers.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

REPORT_ENV = "GPUTRACE_LIVE_REPORT"
MARKER = "live"
WORKER_KEY = "gputrace_live"
"""Where a pytest-xdist worker leaves its live lists for the controller (workeroutput)."""
RAN = ("passed", "failed", "xfailed", "xpassed")
_RANK = {"passed": 0, "xpassed": 1, "xfailed": 2, "skipped": 3, "failed": 4}


def _is_live(item: pytest.Item) -> bool:
    return item.get_closest_marker(MARKER) is not None


def plain_nodeid(nodeid: str) -> str:
    """The node id without the `@GROUP` that pytest-xdist (`--dist loadgroup`) appends to
    the ids of tests marked `xdist_group`, so a report names a test the same way with
    workers and without. Only a suffix after the last `::` and the last `]` is one: a
    test's name cannot hold `@`, its parameter ids can (inside the brackets)."""
    head, sep, tail = nodeid.rpartition("::")
    at = tail.rfind("@")
    if sep and at > tail.rfind("]"):
        return head + sep + tail[:at]
    return nodeid


class LiveRecorder:
    """pytest plugin: collects the live items and their outcomes; writes the report.

    In a pytest-xdist worker it only hands its lists to the controller; the controller
    (or a plain session) writes the file."""

    def __init__(self, path: Path, config: pytest.Config) -> None:
        self.path = path
        self.config = config
        self.defined: list[str] = []
        self.selected: list[str] = []
        self.outcomes: dict[str, str] = {}  # every test's worst phase; filtered at the end

    @property
    def _worker_output(self) -> dict[str, Any] | None:
        out: dict[str, Any] | None = getattr(self.config, "workeroutput", None)
        return out

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        # tryfirst: before -m/-k/--deselect remove anything
        self.defined = [plain_nodeid(i.nodeid) for i in items if _is_live(i)]

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.selected = [plain_nodeid(i.nodeid) for i in session.items if _is_live(i)]
        out = self._worker_output
        if out is not None:
            out[WORKER_KEY] = {"defined": self.defined, "selected": self.selected}

    @pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: absent without it
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        """xdist controller: a worker finished; merge what it collected."""
        got = getattr(node, "workeroutput", {}).get(WORKER_KEY)
        if got is None:
            return  # crashed before collecting: its tests are reported failed by xdist
        self.defined = _merged(self.defined, got["defined"])
        self.selected = _merged(self.selected, got["selected"])

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call" and report.passed:
            return  # a passing setup/teardown says nothing about the test
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed"
        else:
            outcome = report.outcome
        nodeid = plain_nodeid(report.nodeid)
        old = self.outcomes.get(nodeid)
        if old is None or _RANK[outcome] > _RANK[old]:
            self.outcomes[nodeid] = outcome

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self._worker_output is not None:
            return  # a worker: the controller writes the one report
        selected = set(self.selected)
        data = {"defined": self.defined, "selected": self.selected,
                "outcomes": {n: o for n, o in self.outcomes.items() if n in selected}}
        self.path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def _merged(old: list[str], new: list[str]) -> list[str]:
    """`old` then the node ids of `new` not in it (every worker collects the same items)."""
    seen = set(old)
    return old + [n for n in new if n not in seen]


def configure(config: pytest.Config) -> None:
    """Register the recorder when GPUTRACE_LIVE_REPORT names a file (from conftest)."""
    path = os.environ.get(REPORT_ENV)
    if path and not config.pluginmanager.has_plugin("gputrace-live-report"):
        config.pluginmanager.register(LiveRecorder(Path(path), config),
                                      "gputrace-live-report")


def problems(report: dict[str, Any]) -> list[str]:
    """Why this session's live tests do not count as run (empty when they do)."""
    defined = list(report.get("defined", []))
    outcomes: dict[str, str] = dict(report.get("outcomes", {}))
    out = []
    if not defined:
        out.append("no test marked live was collected")
    skipped = sorted(n for n in defined if outcomes.get(n) == "skipped")
    missing = sorted(n for n in defined if n not in outcomes)
    for n in skipped:
        out.append(f"live test skipped: {n}")
    for n in missing:
        out.append(f"live test not run (deselected or never reported): {n}")
    ran = sum(1 for n in defined if outcomes.get(n) in RAN)
    if ran < len(defined):
        out.append(f"{ran} of {len(defined)} live tests ran")
    return out


def main(argv: list[str] | None = None) -> int:
    """Check a report file; exit 1 when live tests did not all run."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python3 -m tests.live_report REPORT.json", file=sys.stderr)
        return 2
    path = Path(args[0])
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        print(f"live tests: no usable report at {path} ({e}); was pytest run with "
              f"{REPORT_ENV} set?", file=sys.stderr)
        return 1
    found = problems(report)
    if found:
        for line in found:
            print(f"live tests: {line}", file=sys.stderr)
        return 1
    print(f"live tests: all {len(report['defined'])} defined live tests ran")
    return 0


if __name__ == "__main__":
    sys.exit(main())
