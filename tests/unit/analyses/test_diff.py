"""`gputrace diff`: a planted change between two synthetic traces of the same job is
reported exactly, identical traces report no change and exit 0, and --fail-on
thresholds exit 3."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gputrace.cli import main
from gputrace.trace.builder import MiB
from tests.analyze_helpers import scenarios


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Synthetic: training_leak twice, and once more with a planted 4 MiB leak from
    planted_leak at 2.45 s (during an iteration's 256 MiB activation: peak +4 MiB)."""
    d = tmp_path_factory.mktemp("diff")
    sc = scenarios()
    out = {"before": sc.training_leak().build(d / "before", force=True),
           "same": sc.training_leak().build(d / "same", force=True)}
    b = sc.training_leak()
    b.cuda_alloc(2.45, 1000, 4 * MiB, stack=["planted_leak", "main"])
    out["after"] = b.build(d / "after", force=True)
    return out


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(["diff", *args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_identical_traces_no_change(runs: dict[str, Path],
                                    capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, str(runs["before"]), str(runs["same"]), "-f", "json",
                     "--fail-on", "leak_bytes>+0%,peak>+0B")
    assert rc == 0
    d = json.loads(out)
    assert d["changed"] is False
    for k in ("leak_sites", "process_peaks", "gpu_peaks", "fault_rates", "ioctl_latency"):
        assert d[k] == []
    assert d["leak_bytes"]["delta"] == 0
    rc, out, _ = run(capsys, str(runs["before"]), str(runs["same"]))
    assert rc == 0 and "no change" in out


def test_planted_change_reported_exactly(runs: dict[str, Path],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, str(runs["before"]), str(runs["after"]), "-f", "json")
    assert rc == 0
    d = json.loads(out)
    assert d["changed"] is True
    assert d["leak_bytes"]["before"] == 160 * MiB and d["leak_bytes"]["delta"] == 4 * MiB
    (site,) = d["leak_sites"]
    assert (site["layer"], site["comm"], site["stack"], site["status"]) == (
        "api", "train", "planted_leak < main", "new")
    assert site["bytes"]["after"] == 4 * MiB and site["count"]["after"] == 1
    (proc,) = d["process_peaks"]
    assert (proc["layer"], proc["comm"]) == ("api", "train")
    assert proc["peak_bytes"]["delta"] == 4 * MiB
    assert proc["live_end_bytes"]["delta"] == 4 * MiB
    assert d["gpu_peaks"] == [] and d["fault_rates"] == [] and d["ioctl_latency"] == []


def test_fail_on_thresholds(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    before, after = str(runs["before"]), str(runs["after"])
    # +4 MiB on 160 MiB is +2.5 %: over 1 %, under 10 %
    assert run(capsys, before, after, "--fail-on", "leak_bytes>+10%")[0] == 0
    rc, out, err = run(capsys, before, after, "--fail-on", "leak_bytes>+1%")
    assert rc == 3 and "leak_bytes rose by 4194304 bytes" in err and "planted_leak" in out
    assert run(capsys, before, after, "--fail-on", "peak>+1GiB")[0] == 0
    rc, _, err = run(capsys, before, after, "--fail-on", "peak>+1MiB")
    assert rc == 3 and "peak of process train (api) rose by 4194304" in err
    # the report is written before exiting 3
    rc, out, _ = run(capsys, before, after, "-f", "json", "--fail-on", "peak>+1MiB")
    assert rc == 3 and json.loads(out)["changed"] is True


@pytest.mark.parametrize("cond", ["bogus>1%", "leak_bytes<1%", "ioctl_p99>+1MiB",
                                  "peak>+lots"])
def test_bad_fail_on_is_a_usage_error(runs: dict[str, Path], cond: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, str(runs["before"]), str(runs["same"]), "--fail-on", cond)
    assert rc == 2 and err.startswith("gputrace: error: --fail-on")


def test_html_diff(runs: dict[str, Path], tmp_path: Path,
                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "d.html"
    assert run(capsys, str(runs["before"]), str(runs["after"]), "-f", "html",
               "-o", str(out))[0] == 0
    page = out.read_text()
    assert "planted_leak &lt; main" in page and "new" in page
    assert "160.0 MiB -&gt; 164.0 MiB (+2.5%)" in page
