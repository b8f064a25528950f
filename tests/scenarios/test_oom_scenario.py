"""The oom report against planted truth: fixtures/scenarios/build.py's
`oom_capacity_fragmentation` (numbers in its docstring), and small stories built here
for the verdicts that scenario does not reach (no sample, allocator pool, limit)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gputrace.trace.builder import GiB, MiB, TraceBuilder
from tests.analyze_helpers import SCENARIO_DIR, analyze

OOM = SCENARIO_DIR / "oom_capacity_fragmentation"


@pytest.fixture(scope="module")
def rep() -> dict[str, Any]:
    doc: dict[str, Any] = analyze(OOM, ["oom"])["oom"]
    return doc


def _holders(inc: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {h["pid"]: h for h in inc["holders"]}


def test_two_incidents_three_failures(rep: dict[str, Any]) -> None:
    assert (rep["count"], rep["failures"]) == (2, 3)
    assert [(v["verdict"], v["incidents"], v["failures"], v["requested_bytes"])
            for v in rep["by_verdict"]] == [("capacity", 1, 2, 256 * MiB),
                                            ("fragmentation", 1, 1, 160 * MiB)]


def test_capacity_retry_pair_is_one_incident(rep: dict[str, Any]) -> None:
    inc = rep["incidents"][0]
    assert (inc["verdict"], inc["pid"], inc["tid"], inc["comm"], inc["layer"], inc["call"],
            inc["status"], inc["gpu_index"], inc["requested_bytes"], inc["attempts"],
            inc["t_s"]) == ("capacity", 100, 100, "train", "api", "cuMemAlloc_v2", 2, 0,
                            256 * MiB, 2, 40.0)
    assert inc["stack"] == "alloc_batch < train_step < main"
    assert inc["last_ts_ns"] - inc["ts_ns"] == 300_000_000
    assert inc["gpu"] == {"total_bytes": GiB, "free_bytes": 128 * MiB,
                          "largest_free_bytes": 128 * MiB,
                          "sample_ts_ns": inc["ts_ns"] + 2_000_000,
                          "sample_trigger": "incident",
                          "sample_distance_ns": 2_000_000 - 10_000,
                          "sample_delay_ns": 1_990_000}
    assert inc["evidence"] == "requested 256.0 MiB > free 128.0 MiB"


def test_capacity_holders_driver_beside_recorded(rep: dict[str, Any]) -> None:
    inc = rep["incidents"][0]
    assert [h["pid"] for h in inc["holders"]] == [100, 200, 300]
    h = _holders(inc)
    assert (h[100]["driver_bytes"], h[100]["api_bytes"], h[100]["rm_bytes"],
            h[100]["grew_bytes"]) == (512 * MiB, 512 * MiB, 0, 128 * MiB)
    assert [(s["stack"], s["bytes"], s["count"]) for s in h[100]["top_sites"]] == [
        ("load_model < main", 384 * MiB, 1), ("grow_cache < train_step < main", 128 * MiB, 4)]
    assert [(s["stack"], s["bytes"], s["count"]) for s in h[100]["grew_sites"]] == [
        ("grow_cache < train_step < main", 128 * MiB, 4)]
    assert (h[200]["driver_bytes"], h[200]["rm_bytes"], h[200]["api_bytes"],
            h[200]["traced"]) == (256 * MiB, 256 * MiB, 0, True)
    assert (h[300]["driver_bytes"], h[300]["traced"], h[300]["api_bytes"],
            h[300]["rm_bytes"], h[300]["top_sites"]) == (128 * MiB, False, None, None, [])


def test_fragmentation_after_planted_holes(rep: dict[str, Any]) -> None:
    inc = rep["incidents"][1]
    assert (inc["verdict"], inc["pid"], inc["layer"], inc["call"], inc["status"],
            inc["requested_bytes"], inc["attempts"]) == (
        "fragmentation", 200, "rm", "RM_ALLOC", 0x51, 160 * MiB, 1)
    assert (inc["gpu"]["free_bytes"], inc["gpu"]["largest_free_bytes"]) == (192 * MiB,
                                                                            128 * MiB)
    h = _holders(inc)
    assert (h[100]["driver_bytes"], h[100]["api_bytes"], h[100]["grew_bytes"]) == (
        448 * MiB, 448 * MiB, 64 * MiB)
    assert [(s["bytes"], s["count"]) for s in h[100]["grew_sites"]] == [(64 * MiB, 2)]
    assert (h[300]["driver_bytes"], h[300]["traced"]) == (128 * MiB, False)


def test_window_option_moves_growth(tmp_path: Path) -> None:
    """--oom-window 5s: only the 38 s block grew in the 5 s before 40 s."""
    inc = analyze(OOM, ["oom"], oom_window_s=5.0)["oom"]["incidents"][0]
    assert _holders(inc)[100]["grew_bytes"] == 32 * MiB


def test_no_sample_is_unknown_naming_the_layer(tmp_path: Path) -> None:
    b = TraceBuilder(layers=("syscall", "api"), duration_s=2.0, gpu_memory_bytes=GiB)
    b.process(7, "job")
    b.cuda_alloc(1.0, 7, 2 * GiB, result=2)
    inc = analyze(b.build(tmp_path / "t"), ["oom"])["oom"]["incidents"][0]
    assert (inc["verdict"], inc["gpu"], inc["requested_bytes"]) == ("unknown", None, 2 * GiB)
    assert inc["evidence"] == "layer rm_query not recorded: no free-memory sample of GPU 0"


def test_no_gpu_listed_is_said_not_several(tmp_path: Path) -> None:
    # a host recording of the API layer alone lists no GPU: the failure cannot be placed
    b = TraceBuilder(layers=("syscall", "api"), duration_s=2.0, gpus=0)
    b.process(7, "job")
    b.cuda_alloc(1.0, 7, 2 * GiB, result=2)
    inc = analyze(b.build(tmp_path / "t"), ["oom"])["oom"]["incidents"][0]
    assert (inc["verdict"], inc["gpu_index"], inc["requested_bytes"]) == ("unknown", None, 2 * GiB)
    assert inc["evidence"] == "which GPU: the failing call does not say, and the trace lists no GPU"


def test_rm_failures_inside_the_call_are_its_evidence(tmp_path: Path) -> None:
    """The driver retries RM_ALLOC inside one cuMemAlloc (as on the real H200): one
    incident, the two RM failures its `nested` evidence; a GPU with room: limit."""
    b = TraceBuilder(layers=("syscall", "api", "rm_query"), duration_s=2.0,
                     gpu_memory_bytes=GiB)
    b.process(7, "job")
    b.gpu_memory(0.5, 0, heap=GiB, free=900 * MiB, largest=800 * MiB, trigger="tick")
    b.row("cuda_calls", ts_ns=b.rows["processes"][0]["start_ts_ns"] + 1_000_000_000, pid=7,
          func="cuMemAlloc_v2", size_bytes=64 * MiB, ptr=0, result=2, latency_ns=5_000_000)
    for dt in (0.0011, 0.0032):
        b.rm_alloc(1.0 + dt, 7, size=64 * MiB, status=0x51)
    inc = analyze(b.build(tmp_path / "t"), ["oom"])["oom"]
    assert inc["count"] == 1 and inc["failures"] == 1
    one = inc["incidents"][0]
    assert [(n["layer"], n["call"], n["status"]) for n in one["nested"]] == [
        ("rm", "RM_ALLOC", 0x51), ("rm", "RM_ALLOC", 0x51)]
    assert (one["verdict"], one["gpu"]["sample_distance_ns"]) == ("limit", -505_000_000)


def _torch(layers: tuple[str, ...]) -> TraceBuilder:
    b = TraceBuilder(layers=layers, duration_s=4.0, gpu_memory_bytes=2 * GiB)
    b.process(9, "python3")
    t0 = b.rows["processes"][0]["start_ts_ns"]
    for addr, alloc in ((0x10000000, 192 * MiB), (0x30000000, 0)):
        b.row("allocator_segments", pid=9, device=0, address=addr, total_size_bytes=512 * MiB,
              allocated_size_bytes=alloc, active_size_bytes=alloc, requested_size_bytes=alloc,
              stream=0, pool="large")
    b.row("allocator_events", ts_ns=t0 + 2 * 10**9, time_us=2, seq=0, pid=9, device=0,
          action_code=8, size_bytes=600 * MiB, device_free_bytes=200 * MiB)
    b.row("allocator_events", ts_ns=t0 + 3 * 10**9, time_us=3, seq=1, pid=9, device=0,
          action_code=2, address=0x10000000, size_bytes=256 * MiB)
    return b


@pytest.mark.parametrize("sampled", [True, False], ids=["rm-sample", "allocator-free"])
def test_allocator_pool_would_have_served_it(tmp_path: Path, sampled: bool) -> None:
    """PyTorch (pid 9) reserved two 512 MiB segments, 192 MiB of them allocated at the
    snapshot; a 256 MiB block freed at 3 s was still allocated at the 2 s failure: 448
    MiB allocated then, 576 MiB reserved and unallocated. 200 MiB free (an RM sample, or
    without one what CUDA told the allocator): asking 600 MiB is capacity by free memory
    alone, but 200 + 576 would have served it."""
    b = _torch(("api", "allocator", "rm_query") if sampled else ("allocator",))
    if sampled:
        b.gpu_memory(1.9, 0, heap=2 * GiB, free=200 * MiB, largest=200 * MiB, trigger="tick")
    one = analyze(b.build(tmp_path / "t"), ["oom"])["oom"]["incidents"][0]
    assert one["gpu"]["free_bytes"] == 200 * MiB
    assert one["gpu"]["sample_trigger"] == ("tick" if sampled else "allocator")
    assert (one["layer"], one["verdict"], one["allocator_pool_bytes"]) == (
        "allocator", "allocator pool", 576 * MiB)
    h = _holders(one)[9]
    assert (h["allocator_reserved_bytes"], h["allocator_allocated_bytes"]) == (
        1024 * MiB, 448 * MiB)


def test_fail_on_oom_exits_3() -> None:
    from tests.cli_helpers import cli

    r = cli("analyze", str(OOM), "--only", "oom", "-f", "json", "--fail-on", "oom")
    assert r.returncode == 3, r.stderr
    assert "oom: 2 out-of-memory incident(s) (1 capacity, 1 fragmentation)" in r.stderr
    r = cli("analyze", str(SCENARIO_DIR / "training_leak"), "--only", "oom", "-f", "json",
            "--fail-on", "oom")
    assert r.returncode == 0, r.stderr


def test_html_shows_each_incident_and_the_untraced_holder(tmp_path: Path) -> None:
    from gputrace.cli import main

    out = tmp_path / "r.html"
    assert main(["analyze", str(OOM), "--only", "oom", "-f", "html", "-o", str(out)]) == 0
    page = out.read_text()
    assert "Incident 1: capacity" in page and "Incident 2: fragmentation" in page
    assert page.count("not traced") == 2  # pid 300 in both incidents' holders
    assert "alloc_batch &lt; train_step &lt; main" in page


def test_absurd_request_size_is_capacity_not_a_crash(tmp_path: Path) -> None:
    """A traced process chooses the size it asks for: 2^64 - 1 bytes is still a number."""
    b = TraceBuilder(layers=("api", "rm_query"), duration_s=2.0, gpu_memory_bytes=GiB)
    b.process(7, "job")
    b.gpu_memory(0.5, 0, heap=GiB, free=GiB, largest=GiB, trigger="tick")
    b.cuda_alloc(1.0, 7, (1 << 64) - 1, result=2)
    inc = analyze(b.build(tmp_path / "t"), ["oom"])["oom"]["incidents"][0]
    assert (inc["verdict"], inc["requested_bytes"]) == ("capacity", (1 << 64) - 1)


def test_hostile_names_are_inert_in_terminal_and_html(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A process names itself and its binaries name its frames: the incident's comm and
    stacks reach the terminal escaped and the HTML page as text."""
    from gputrace.cli import main
    from tests.unit.render.test_render_safety import EVIL_COMM, EVIL_SYMBOL, assert_inert

    b = TraceBuilder(layers=("api", "rm_query"), duration_s=3.0, gpu_memory_bytes=GiB)
    b.process(7, EVIL_COMM, pod_uid="0c5e7a3e-1d2b-4c8f-9a6e-2f4d8b1c7e01",
              pod_namespace="<script>ns", pod_name=EVIL_COMM)
    b.gpu_memory(0.5, 0, heap=GiB, free=64 * MiB, largest=64 * MiB, trigger="tick")
    b.cuda_alloc(0.8, 7, 256 * MiB, stack=[EVIL_SYMBOL, "<script>main"])
    b.cuda_alloc(1.0, 7, 128 * MiB, result=2, stack=[EVIL_SYMBOL, "<script>main"])
    trace = b.build(tmp_path / "t")
    assert main(["analyze", str(trace), "--only", "oom"]) == 0
    out = capsys.readouterr().out
    assert_inert(out)
    assert "\\x1b[2J\\x1b]0;pwned\\x07" in out and "CAPACITY" in out
    page = tmp_path / "r.html"
    assert main(["analyze", str(trace), "--only", "oom", "-f", "html", "-o", str(page)]) == 0
    html = page.read_text()
    assert "<script>main" not in html and "&lt;script&gt;main" in html
    assert "<script>ns" not in html and "in pod &lt;script&gt;ns/" in html
    assert_inert(html)


def test_incidents_and_holders_name_their_pod(rep: dict[str, Any]) -> None:
    cap, frag = rep["incidents"]
    assert (cap["pod_namespace"], cap["pod_name"], cap["container_name"],
            cap["container_runtime"], cap["qos_class"]) == (
        "ml", "trainer-0", "trainer", "containerd", "burstable")
    assert (frag["pod_name"], frag["container_name"], frag["container_id"]) == (
        "server-0", "server", "b2" * 32)
    assert {h["pid"]: h["pod_name"] for h in cap["holders"]} == {
        100: "trainer-0", 200: "server-0", 300: None}  # 300: no processes row


def test_terminal_and_html_say_where_each_failure_ran(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from gputrace.cli import main

    assert main(["analyze", str(OOM), "--only", "oom"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "pid 100 (train) tid 100 in pod ml/trainer-0, container trainer: cuMemAlloc_v2" in out
    assert "pid 200 (serve) tid 200 in pod prod/server-0, container server: RM_ALLOC" in out
    page = tmp_path / "r.html"
    assert main(["analyze", str(OOM), "--only", "oom", "-f", "html", "-o", str(page)]) == 0
    assert "tid 100 in pod ml/trainer-0, container trainer," in page.read_text()


def test_by_pod_adds_up_incidents_of_the_failing_pods() -> None:
    doc = analyze(OOM, ["oom"], by="pod")["oom"]
    assert [(r["pod_namespace"], r["pod_name"], r["incidents"], r["failures"],
             r["requested_bytes"], r["processes"]) for r in doc["by_pod"]] == [
        ("ml", "trainer-0", 1, 2, 256 * MiB, 1), ("prod", "server-0", 1, 1, 160 * MiB, 1)]
    by_c = analyze(OOM, ["oom"], by="container")["oom"]["by_container"]
    assert [(r["container_name"], r["incidents"]) for r in by_c] == [
        ("trainer", 1), ("server", 1)]
