"""`analyze --by pod|container`: leaks, summary and fault rate added up per pod and per
container, from the processes' identity columns (planted truth below)."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from gputrace.analyses import registry
from gputrace.analyses.helpers.identity import GROUP_KEYS, by_identity, with_identity
from gputrace.analyses.report_spec import GROUPINGS
from gputrace.cli import main
from gputrace.trace.builder import TraceBuilder
from tests.analyze_helpers import analyze

MiB = 1 << 20
U1, U2 = "6b1e4c1a-0d0f-4a55-9a5c-3f2b1d0e9c11", "9f3a2b7c-5e1d-4c8b-8a0f-1d2c3b4a5e66"
C1, C2, C3 = ("a1" * 32), ("b2" * 32), ("c3" * 32)
TRAINER = {"pod_uid": U1, "qos_class": "burstable", "pod_namespace": "ml",
           "pod_name": "trainer-0"}
EVAL = {"pod_uid": U2, "qos_class": "besteffort", "pod_namespace": "ml", "pod_name": "eval-0"}
# planted: leaked RM bytes per process; 101 also frees 3 MiB (not leaked). Only the RM
# layer is recorded: each process's one held figure is its unfreed RM bytes
LEAKED = {101: 5 * MiB, 102: 2 * MiB, 201: 8 * MiB, 301: 16 * MiB}


def _trace(tmp_path: Path) -> Path:
    b = TraceBuilder(("syscall", "cpu_faults"), duration_s=10.0)
    b.process(101, "train", container_id=C1, container_runtime="containerd",
              container_name="cuda", **TRAINER)
    b.process(102, "sidecar", container_id=C2, container_runtime="containerd",
              container_name="side", **TRAINER)
    b.process(201, "eval", container_id=C3, container_runtime="cri-o", container_name="cuda",
              **EVAL)
    b.process(301, "host-job")
    b.rm_alloc(1.0, 101, size=4 * MiB)
    b.rm_alloc(1.1, 101, size=1 * MiB)
    h = b.rm_alloc(1.2, 101, size=3 * MiB)
    b.rm_free(2.0, 101, handle=h)
    b.rm_alloc(1.0, 102, size=2 * MiB)
    b.rm_alloc(1.0, 201, size=8 * MiB)
    b.rm_alloc(1.0, 301, size=16 * MiB)
    for i in range(3):  # CPU faults: 3 in 101, 2 in 201
        b.cpu_fault(3.0 + i, 101, 0x7000_0000_0000 + i * 4096, write=True)
    for i in range(2):
        b.cpu_fault(3.0 + i, 201, 0x7100_0000_0000 + i * 4096, write=False)
    return b.build(tmp_path / "t")


def test_groupings_are_the_helpers_keys() -> None:
    assert set(GROUPINGS) == set(GROUP_KEYS)


def test_leaks_summary_fault_rate_by_pod(tmp_path: Path) -> None:
    doc = analyze(_trace(tmp_path), ["leaks", "summary", "fault-rate"], by="pod")
    rows = doc["leaks"]["by_pod"]
    got = {r["pod_name"]: (r["held_bytes"], r["pieces"], r["processes"]) for r in rows}
    assert got == {"trainer-0": (7 * MiB, 3, 2), "eval-0": (8 * MiB, 1, 1),
                   None: (16 * MiB, 1, 1)}
    # the layer is a breakdown column beside the figure, and the classes add up to it
    for r in rows:
        assert (r["rm_layer_bytes"], r["api_layer_bytes"]) == (r["held_bytes"], 0)
        assert r["driver_only_bytes"] == r["held_bytes"]
    # the columns the registry declares for the table are the rows' own
    cols = registry.spec("leaks").columns
    assert set(cols["by_pod"]) == set(rows[0])
    assert [r["pod_name"] for r in rows] == [None, "eval-0", "trainer-0"]  # most bytes first
    assert {r["pod_uid"]: r["qos_class"] for r in rows} == {
        U1: "burstable", U2: "besteffort", None: None}
    summ = {r["pod_name"]: r for r in doc["summary"]["by_pod"]}
    assert summ["trainer-0"]["live_end_bytes"] == 7 * MiB
    assert summ["trainer-0"]["sum_of_peaks_bytes"] == 10 * MiB  # 101 peaked at 8, 102 at 2
    assert summ["trainer-0"]["pieces"] == 4
    # one row per pod (the joined model), the layer a labelled breakdown beside it
    assert len(doc["summary"]["by_pod"]) == 3
    assert summ["trainer-0"]["rm_layer_live_end_bytes"] == 7 * MiB
    assert summ["trainer-0"]["driver_only_bytes"] == 7 * MiB
    assert set(registry.spec("summary").columns["by_pod"]) == set(summ["trainer-0"])
    faults = {r["pod_name"]: r["faults"] for r in doc["fault_rate"]["by_pod"]}
    assert faults == {"trainer-0": 3, "eval-0": 2}
    assert "by_container" not in doc["leaks"]


def test_leaks_by_container_and_not_asked(tmp_path: Path) -> None:
    path = _trace(tmp_path)
    doc = analyze(path, ["leaks"], by="container")
    got = {r["container_id"]: (r["container_name"], r["container_runtime"], r["pod_name"],
                               r["held_bytes"]) for r in doc["leaks"]["by_container"]}
    cols = registry.spec("leaks").columns["by_container"]
    assert set(cols) == set(doc["leaks"]["by_container"][0])
    assert got == {C1: ("cuda", "containerd", "trainer-0", 5 * MiB),
                   C2: ("side", "containerd", "trainer-0", 2 * MiB),
                   C3: ("cuda", "cri-o", "eval-0", 8 * MiB), None: (None, None, None, 16 * MiB)}
    assert "by_pod" not in analyze(path, ["leaks"])["leaks"]


def test_cli_by(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _trace(tmp_path)
    out = tmp_path / "r.json"
    assert main(["analyze", str(path), "--only", "leaks", "--by", "pod", "-f", "json",
                 "-o", str(out)]) == 0
    assert {x["pod_name"] for x in json.loads(out.read_text())["leaks"]["by_pod"]} == {
        "trainer-0", "eval-0", None}
    txt = tmp_path / "r.txt"
    assert main(["analyze", str(path), "--only", "leaks", "--by", "pod", "-o", str(txt)]) == 0
    assert "Leaks by pod" in txt.read_text() and "trainer-0" in txt.read_text()
    html = tmp_path / "r.html"
    assert main(["analyze", str(path), "--by", "container", "-f", "html", "-o", str(html)]) == 0
    assert "Leaks by container" in html.read_text() and C3 in html.read_text()
    capsys.readouterr()
    assert main(["analyze", str(path), "--by", "node"]) != 0
    assert "--by must be pod or container" in capsys.readouterr().err


def test_with_identity_tells_a_reused_pid_apart() -> None:
    procs = pl.LazyFrame({
        "pid": [7, 7], "start_ts_ns": [None, 500], "pod_uid": [U1, U2],
        **{c: [None, None] for c in ("container_id", "container_runtime", "qos_class",
                                     "pod_namespace", "pod_name", "container_name")}},
        schema_overrides={"start_ts_ns": pl.Int64})
    ev = pl.LazyFrame({"pid": [7, 7, 7], "ts_ns": [600, 100, 499]})
    got = with_identity(ev, procs, at="ts_ns").collect()
    assert got["ts_ns"].to_list() == [600, 100, 499]  # the frame's order kept
    assert got["pod_uid"].to_list() == [U2, U1, U1]
    # by pid alone: the latest instance
    assert with_identity(ev, procs).collect()["pod_uid"].to_list() == [U2] * 3
    grouped = by_identity(ev.with_columns(n=pl.lit(1)), procs, "pod", ["n"]).collect()
    assert grouped.select("pod_uid", "n", "processes").to_dicts() == [
        {"pod_uid": U2, "n": 3, "processes": 1}]


@pytest.mark.parametrize("by", GROUPINGS)
def test_old_traces_group_all_in_one(tmp_path: Path, by: str) -> None:
    """A trace with no identity (none recorded, or older than the columns): one null
    group holding everything."""
    b = TraceBuilder(("syscall",), duration_s=5.0)
    b.process(1, "a")
    b.rm_alloc(1.0, 1, size=MiB)
    rows = analyze(b.build(tmp_path / "t"), ["leaks"], by=by)["leaks"][f"by_{by}"]
    assert [(r["pod_uid"], r["held_bytes"]) for r in rows] == [(None, MiB)]


def test_names_from_a_trace_never_reach_the_terminal_raw(tmp_path: Path) -> None:
    """A trace is untrusted: a pod name holding an escape sequence prints as its escape."""
    b = TraceBuilder(("syscall",), duration_s=5.0)
    b.process(1, "a", pod_uid=U1, pod_namespace="ml", pod_name="evil\x1b]0;pwned\x07")
    b.rm_alloc(1.0, 1, size=MiB)
    path = b.build(tmp_path / "t")
    out = tmp_path / "r.txt"
    assert main(["analyze", str(path), "--only", "leaks", "--by", "pod", "-o", str(out)]) == 0
    text = out.read_text()
    assert "\x1b" not in text and "\x07" not in text and "evil\\x1b]0;pwned\\x07" in text
    html = tmp_path / "r.html"
    assert main(["analyze", str(path), "--by", "pod", "-f", "html", "-o", str(html)]) == 0
    assert "\x1b" not in html.read_text()
