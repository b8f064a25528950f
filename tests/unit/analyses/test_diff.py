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
        "api", "train", "planted_leak", "new")  # matched by site: the user's frame
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
    assert "planted_leak" in page and "new" in page
    assert "160.0 MiB -&gt; 164.0 MiB (+2.5%)" in page


@pytest.fixture(scope="module")
def layers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Synthetic: the same program recorded twice with different layers: syscall only
    (its 64 MiB leak seen as RM video memory) and API only (a 266 MiB cuMemAlloc leak)."""
    from gputrace.trace.builder import TraceBuilder

    d = tmp_path_factory.mktemp("layers")
    rm = TraceBuilder(layers=("syscall",), duration_s=2.0)
    rm.process(10, "train")
    rm.rm_alloc(0.5, 10, size=64 * MiB)
    api = TraceBuilder(layers=("api",), duration_s=2.0)
    api.process(10, "train")
    api.cuda_alloc(0.5, 10, 266 * MiB, stack=["keep", "main"])
    return {"rm": rm.build(d / "rm", force=True), "api": api.build(d / "api", force=True)}


def test_leaks_in_different_layers_warn(layers: dict[str, Path],
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """RM bytes against API bytes: the diff says they do not compare (the leaked-bytes
    line alone would read 64.0 MiB -> 266.0 MiB)."""
    rc, out, _ = run(capsys, str(layers["rm"]), str(layers["api"]), "-f", "json")
    assert rc == 0
    d = json.loads(out)
    assert d["leak_layers"]["before"] == ["syscall"] and d["leak_layers"]["after"] == ["api"]
    assert d["leak_bytes"]["before"] == 64 * MiB and d["leak_bytes"]["after"] == 266 * MiB
    assert "different layers" in d["leak_layers"]["mismatch"]
    assert d["warnings"][0] == d["leak_layers"]["mismatch"]
    rc, out, _ = run(capsys, str(layers["rm"]), str(layers["api"]))
    assert rc == 0 and "warning: the traces measured leaks in different layers" in out
    assert "syscall (driver (RM) bytes)" in out.replace("\n", " ")


@pytest.mark.parametrize("cond", ["leak_bytes>+10%", "peak>+1GiB"])
def test_leaks_in_different_layers_refuse_fail_on(layers: dict[str, Path], cond: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, str(layers["rm"]), str(layers["api"]), "--fail-on", cond)
    assert rc == 2 and "different layers" in err and err.count("\n") == 1
    # the same layers on both sides: no warning
    rc, out, _ = run(capsys, str(layers["api"]), str(layers["api"]), "-f", "json")
    assert rc == 0 and json.loads(out)["leak_layers"]["mismatch"] is None


def test_snapshots_by_site_device_and_pool(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Two C++-stack snapshots (tests/cpp_snapshot.py): the second drops the first site,
    grows the second from 2 to 20 MiB and adds nothing else; sites are matched by the
    user's line, reserved and allocated per device and pool."""
    from tests import cpp_snapshot

    sites = cpp_snapshot.SITES
    sizes = {s: i + 1 for i, s in enumerate(sites)}
    traces = []
    for name, change in (("a", {}), ("b", {sites[0]: 0, sites[1]: 20})):
        snap = cpp_snapshot.write(tmp_path / f"{name}.pickle", {**sizes, **change})
        assert main(["import", "torch-snapshot", str(snap), "-o", str(tmp_path / name)]) == 0
        traces.append(str(tmp_path / name))
    capsys.readouterr()
    rc, out, _ = run(capsys, *traces, "-f", "json")
    assert rc == 0
    d = json.loads(out)
    got = {(r["site"], r["status"]): (r["bytes"]["before"], r["bytes"]["after"])
           for r in d["tensor_sites"]}
    assert got == {("forward (/home/u/proj/a/model.py:42)", "gone"): (1 * MiB, None),
                   ("forward (/home/u/proj/b/model.py:42)", "grown"): (2 * MiB, 20 * MiB)}
    (pool,) = d["allocator_pools"]
    total = sum(sizes.values()) * MiB
    assert (pool["device"], pool["pool"], pool["status"]) == (0, "large", "grown")
    assert pool["reserved_bytes"]["before"] == total
    assert pool["reserved_bytes"]["after"] == total - 1 * MiB + 18 * MiB
    assert pool["allocated_bytes"]["delta"] == 17 * MiB
    rc, out, _ = run(capsys, *traces)
    assert "Tensors alive by site" in out and "tensors" in out and "calls" not in out
    assert "17.0 MiB" not in out and "45.0 MiB -> 62.0 MiB (+37.8%)" in out
