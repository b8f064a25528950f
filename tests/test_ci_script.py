"""The CI gate refuses skipped live tests: .ci/check-live (the last step of .ci/run)
exits non-zero when any test marked `live` skipped or did not run, including on a
host where FUSE is unavailable (fusermount3 hidden from PATH)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.live_report import REPORT_ENV, main, plain_nodeid, problems

CHECK = ROOT / ".ci" / "check-live"
FUSE_TEST = "tests/live/test_standin.py::test_vid_heap_control"


def _report(outcomes: dict[str, str], defined: list[str] | None = None) -> dict[str, object]:
    d = list(outcomes) if defined is None else defined
    return {"defined": d, "selected": list(outcomes), "outcomes": outcomes}


def test_all_live_tests_passed_is_accepted() -> None:
    assert problems(_report({"a::t1": "passed", "a::t2": "failed", "a::t3": "xfailed"})) == []


def test_one_skipped_live_test_is_refused() -> None:
    got = problems(_report({"a::t1": "passed", "a::t2": "skipped"}))
    assert "live test skipped: a::t2" in got and "1 of 2 live tests ran" in got


def test_fewer_ran_than_defined_is_refused() -> None:
    """`-m "not live"` or `-k` deselected some: defined counts them, outcomes do not."""
    got = problems(_report({"a::t1": "passed"}, defined=["a::t1", "a::t2", "b::t3"]))
    assert "1 of 3 live tests ran" in got
    assert "live test not run (deselected or never reported): b::t3" in got


def test_no_live_test_defined_is_refused() -> None:
    assert problems(_report({})) == ["no test marked live was collected"]


def test_missing_or_bad_report_is_refused(tmp_path: Path) -> None:
    assert main([str(tmp_path / "absent.json")]) == 1
    (tmp_path / "bad.json").write_text("{")
    assert main([str(tmp_path / "bad.json")]) == 1


@pytest.mark.parametrize(("outcomes", "rc"), [({"x::t": "passed"}, 0), ({"x::t": "skipped"}, 1)])
def test_check_live_script_exit_status(tmp_path: Path, outcomes: dict[str, str],
                                       rc: int) -> None:
    rep = tmp_path / "r.json"
    rep.write_text(json.dumps(_report(outcomes)))
    r = subprocess.run(["bash", str(CHECK), str(rep)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == rc, r.stdout + r.stderr


def _path_without(tmp_path: Path, hidden: str) -> str:
    """A PATH with every program of the current PATH except `hidden`."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for d in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(d):
            continue
        for name in os.listdir(d):
            if name == hidden or (bindir / name).exists():
                continue
            src = Path(d) / name
            if os.access(src, os.X_OK) and not src.is_dir():
                (bindir / name).symlink_to(src)
    return str(bindir)


def _pytest_session(tmp_path: Path, path: str, report: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": path, REPORT_ENV: str(report)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", FUSE_TEST],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_ci_fails_when_fusermount3_is_hidden(tmp_path: Path) -> None:
    """A pytest session on a host without fusermount3 is green (the FUSE test skips),
    but the CI gate exits non-zero and names the skipped live test."""
    report = tmp_path / "live.json"
    r = _pytest_session(tmp_path, _path_without(tmp_path, "fusermount3"), report)
    assert r.returncode == 0 and "1 skipped" in r.stdout, r.stdout + r.stderr
    data = json.loads(report.read_text())
    assert data["defined"] == [FUSE_TEST] and data["outcomes"] == {FUSE_TEST: "skipped"}
    gate = subprocess.run(["bash", str(CHECK), str(report)], capture_output=True, text=True,
                          timeout=120)
    assert gate.returncode == 1
    assert f"live test skipped: {FUSE_TEST}" in gate.stderr


@pytest.mark.live
def test_ci_passes_when_the_fuse_test_runs(tmp_path: Path) -> None:
    """Control: the same session with FUSE available runs the test and the gate passes
    (so the refusal above is about FUSE, not about the gate)."""
    from tests.standin.standin import skip_reason

    if (why := skip_reason()) is not None:
        pytest.skip(why)
    report = tmp_path / "live.json"
    r = _pytest_session(tmp_path, os.environ.get("PATH", ""), report)
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout + r.stderr
    gate = subprocess.run(["bash", str(CHECK), str(report)], capture_output=True, text=True,
                          timeout=120)
    assert gate.returncode == 0, gate.stderr


XDIST_TESTS = [FUSE_TEST, "tests/live/test_standin.py::test_expected_json_counts",
               "tests/live/test_standin.py::test_expected_json_is_json",
               "tests/live/test_standin.py::test_print_expected_matches_expected_json"]


@pytest.mark.live
def test_report_merges_every_worker_under_xdist(tmp_path: Path) -> None:
    """With pytest-xdist workers (`-n 2`, as scripts/test.sh runs the suite) the one
    report lists every live test and its outcome, whichever worker ran it: the
    controller collects nothing itself, so it must merge what the workers send (a
    report written by a worker, or by the controller alone, lists only part of them)."""
    from tests.standin.standin import skip_reason

    pytest.importorskip("xdist")
    if (why := skip_reason()) is not None:
        pytest.skip(why)
    report = tmp_path / "live.json"
    env = {**os.environ, REPORT_ENV: str(report)}
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-n", "2",
         *XDIST_TESTS], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "4 passed" in r.stdout, r.stdout + r.stderr
    assert "[gw0] " in r.stdout and "[gw1] " in r.stdout, r.stdout  # both workers ran tests
    data = json.loads(report.read_text())
    assert sorted(data["defined"]) == sorted(data["selected"]) == sorted(XDIST_TESTS)
    assert data["outcomes"] == dict.fromkeys(XDIST_TESTS, "passed")
    gate = subprocess.run(["bash", str(CHECK), str(report)], capture_output=True, text=True,
                          timeout=120)
    assert gate.returncode == 0, gate.stderr


def test_report_names_grouped_tests_without_the_xdist_group() -> None:
    """`--dist loadgroup` appends `@GROUP` to the ids of tests marked xdist_group; the
    report strips it (so ids match a run without workers) and nothing else."""
    assert plain_nodeid("tests/a.py::test_x@grp") == "tests/a.py::test_x"
    assert plain_nodeid("tests/a.py::test_x[v2-16]@grp") == "tests/a.py::test_x[v2-16]"
    assert plain_nodeid("tests/a.py::test_x[a@b]") == "tests/a.py::test_x[a@b]"
    assert plain_nodeid("tests/a@b.py::test_x") == "tests/a@b.py::test_x"
    assert plain_nodeid("tests/a.py::C::test_x@g") == "tests/a.py::C::test_x"


EXCLUSIVE_DEMO = """
import os, time, pytest

def _span(name):
    with open(os.environ["SPANS"], "a") as f:
        f.write(f"{name} start {time.monotonic_ns()}\\n")
    time.sleep(0.3)
    with open(os.environ["SPANS"], "a") as f:
        f.write(f"{name} end {time.monotonic_ns()}\\n")

@pytest.mark.parametrize("i", range(3))
def test_before(i):
    _span(f"before{i}")

@pytest.mark.exclusive
def test_alone():
    _span("alone")

@pytest.mark.parametrize("i", range(5))
def test_after(i):
    _span(f"after{i}")
"""


def test_exclusive_test_overlaps_no_other_under_xdist(tmp_path: Path) -> None:
    """A test marked `exclusive` (tests/conftest.py) runs while no other worker is in a
    test, and no test starts until it ends: two workers run nine tests of 0.3 s, one of
    them exclusive; its span overlaps none of the others' (without the lock the other
    worker runs its tests meanwhile)."""
    pytest.importorskip("xdist")
    (tmp_path / "test_demo.py").write_text(EXCLUSIVE_DEMO)
    spans = tmp_path / "spans.txt"
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
         "-n", "2", "--rootdir", str(tmp_path), str(tmp_path / "test_demo.py")],
        cwd=ROOT, env={**os.environ, "SPANS": str(spans)}, capture_output=True, text=True,
        timeout=600)  # fmt: skip
    assert r.returncode == 0 and "9 passed" in r.stdout, r.stdout + r.stderr
    at: dict[str, dict[str, int]] = {}
    for line in spans.read_text().splitlines():
        name, what, ns = line.split()
        at.setdefault(name, {})[what] = int(ns)
    assert len(at) == 9
    alone = at.pop("alone")
    for name, other in at.items():
        assert other["end"] < alone["start"] or other["start"] > alone["end"], name


def test_setup_installs_what_the_stand_in_toolchain_checks() -> None:
    """Every tool the stand-ins' skip checks look for is installed by the set-up."""
    import re

    setup = (ROOT / "scripts" / "setup-record.sh").read_text()
    checked = set()
    for f in ("tests/standin/standin.py", "tests/standin_cuda/standin_cuda.py"):
        text = (ROOT / f).read_text()
        checked |= set(re.findall(r'shutil\.which\("([\w.-]+)"\)', text))
        checked |= {t for group in re.findall(r'for tool in \(([^)]*)\)', text)
                    for t in re.findall(r'"([\w.-]+)"', group)}
    assert {"gcc", "make", "pkg-config", "fusermount3"} <= checked
    m = re.search(r"^for tool in ([^;]*); do", setup, re.M)
    assert m is not None, "setup-record.sh ends by checking the live tests' tools"
    assert checked <= set(m.group(1).split())
    for pkg in ("fuse3", "libfuse3-dev", "make", "pkg-config", "gcc", "python3-bpfcc",
                "linux-headers-amd64"):
        assert re.search(rf'need="\$need {re.escape(pkg)}"', setup), pkg
