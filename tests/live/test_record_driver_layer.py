"""`gputrace record` with the driver layer against the TEST STAND-IN (tests/standin):
the trace's GPU/CPU faults, batches, migrations, driver events and counters equal the
stand-in's own event log and `uvm_workload --print-expected`, RM samples of the
fragmented heap equal the first-fit truth, the recorder's own RM client and tracker
ioctls are absent, the reports use them, and CMD's exit status is passed through.
Two recordings: a command (a shell whose child initializes UVM: attach on the
UVM_INITIALIZE the syscall layer sees) and -p on a process that already had.

Needs root, bcc, kernel headers, /dev/fuse and libfuse3; skips with the reason
otherwise. No sleeps as synchronization: the recorder's "tracker attached" and ready
lines, the workload's READY/FRAGMENTED lines, and the stand-in's request log order
everything (polled with deadlines).
"""

from __future__ import annotations

import json
import queue
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from gputrace.trace.reader import open_trace
from tests.live import test_driver_layer_poller as dl
from tests.record_helpers import (
    COMPILE_S,
    RecorderProc,
    live_skip_reason,
    record_cmd,
    standin_driver_args,
)
from tests.standin import standin

_SKIP = live_skip_reason()
# One pytest-xdist worker runs every test here: they share two recordings (_DONE),
# made once per process.
pytestmark = [pytest.mark.live, pytest.mark.xdist_group("record_driver_live")]
if _SKIP is not None:
    pytestmark.append(pytest.mark.skip(reason=_SKIP))

DEADLINE_S = 60.0
ATTACHED = "gputrace: driver layer: tracker attached to pid "
READY = "gputrace: recording ("
FB_GET_INFO_V2 = "cmd 0x20801303"
TABLES = ("faults", "fault_batches", "migrations", "uvm_events", "uvm_counters", "gpu_memory",
          "ioctls", "files", "processes")  # fmt: skip


class Recording(RecorderProc):
    """`gputrace record` in the background with pipes on all three streams."""

    def __init__(self, argv: list[str]) -> None:
        super().__init__(argv, stdin=subprocess.PIPE)

    def wait_line(self, prefix: str) -> str:
        """Block until the recorder writes a stderr line starting with `prefix` (the
        ready line and the trackers before it come after the BPF compile)."""
        deadline = time.monotonic() + COMPILE_S
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.proc.kill()
                raise AssertionError(f"no {prefix!r} line: {''.join(self.stderr)}") from None
            if line is None:
                raise AssertionError(f"recorder exited early: {''.join(self.stderr)}")
            if line.startswith(prefix):
                return line

    def stdout_line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline()

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def finish(self) -> tuple[int, str]:
        out, _ = self.proc.communicate(timeout=DEADLINE_S)
        self._t.join(timeout=DEADLINE_S)
        return self.proc.returncode, out


def _wait(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def _requests_after(log: Path, offset: int, needle: str) -> int:
    with log.open("rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace").count(needle)


@dataclass
class Recorded:
    run: dl.Run
    trace: Path
    manifest: dict[str, Any]
    tables: dict[str, pa.Table]
    rc: int
    recorder_pid: int
    workload_pids: set[int]
    attached_line: str


def _tables(path: Path) -> dict[str, pa.Table]:
    t = open_trace(path)
    return {name: t.scan(name).collect().to_arrow() for name in TABLES if t.rows(name)}


def _run(version: int, tables: dict[str, pa.Table], m: dict[str, Any], log: Path,
         exp: dict[str, Any], pid: int, times: tuple[int, int, int, int]) -> dl.Run:
    """The driver layer test's view of a run, built from the recorded trace."""
    mf = {**m, "gpu_uuids": [{"index": g["index"], "uuid": g["uuid"]}
                             for g in m["gpus"] if g.get("uuid")]}  # fmt: skip
    logged = [json.loads(x) for x in log.read_text().splitlines()]
    run = dl.Run(version, tables, mf, logged, exp, pid, *times, 0, False)
    run.events = [e for e in logged if e["ev"] == "event" and e["pid"] == pid]
    trackers = [e for e in logged if e["ev"] == "tracker" and e["target_pid"] == pid
                and e["entries"] > 0]  # fmt: skip
    assert len(trackers) == 1 and trackers[0]["version"] == version, trackers
    run.tracker_id = str(trackers[0]["id"])
    return run


ARGS = ["--gpu", str(dl.GPU), "--budget", str(dl.BUDGET), "--frag-blocks", "6",
        "--frag-mib", "64"]  # fmt: skip


def _record_command(tmp: Path) -> Recorded:
    """`record -- sh -c 'uvm_workload ...; exit 7'`: the tracker attaches to the
    shell's child on its UVM_INITIALIZE; the heap is sampled while held fragmented."""
    exe = dl._uvm_workload()
    exp = standin.print_expected(exe, *ARGS)
    log, out = tmp / "events.jsonl", tmp / "cmd.trace"
    with standin.mounted_driver(tmp, budget=dl.BUDGET, gpus=2, event_log=log,
                                verbose=True) as dev:  # fmt: skip
        rec = Recording(record_cmd(
            out, "--device-dir", str(dev), *standin_driver_args(), "--sample-interval", "10ms",
            "--", "sh", "-c", '"$@"; exit 7', "sh", str(exe), str(dev), "--wait", "--hold",
            *ARGS))  # fmt: skip
        try:
            rec.wait_line(READY)
            attached = rec.wait_line(ATTACHED)
            line = rec.stdout_line()
            assert line.startswith("READY "), (line, rec.stderr)
            pid = int(line.split()[1])
            assert attached.strip() == f"{ATTACHED}{pid}"
            t_go = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            rec.send("go\n")
            assert rec.stdout_line() == "FRAGMENTED\n", rec.stderr
            t_frag = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            # four FB_GET_INFO_V2 requests after this point (only the recorder's sampler
            # asks while the workload is held; it asks GPU 0 then GPU 1, one at a time):
            # among the first three is a GPU 1 query that began after FRAGMENTED, and the
            # fourth began after it was answered, so its row lies inside [t_frag, t_resume]
            # however slowly a loaded host runs the sampler (two requests were not enough:
            # a round begun before FRAGMENTED left GPU 1's next query still in flight)
            nvlog = tmp / "nvfuse.log"
            offset = nvlog.stat().st_size
            _wait(lambda: _requests_after(nvlog, offset, FB_GET_INFO_V2) >= 4,
                  "no RM sample while the heap was held fragmented")  # fmt: skip
            t_resume = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            rec.send("\n")
            rc, stdout = rec.finish()
        finally:
            if rec.proc.poll() is None:
                rec.proc.kill()
                rec.proc.wait()
        t_end = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    assert stdout == "DONE\n", (stdout, rec.stderr)
    m = json.loads((out / "manifest.json").read_text())
    tables = _tables(out)
    run = _run(2, tables, m, log, exp, pid, (t_go, t_frag, t_resume, t_end))
    shell = m["target"]["pids"][0]
    return Recorded(run, out, m, tables, rc, rec.proc.pid, {pid, shell}, attached)


def _record_pid(tmp: Path) -> Recorded:
    """`record -p PID` on a workload that initialized UVM before the recording."""
    exe = dl._uvm_workload()
    args = ["--gpu", str(dl.GPU), "--budget", str(dl.BUDGET)]
    exp = standin.print_expected(exe, *args)
    log, out = tmp / "events.jsonl", tmp / "pid.trace"
    with standin.mounted_driver(tmp, budget=dl.BUDGET, gpus=2, event_log=log) as dev:
        with standin.started_waiting([str(exe), str(dev), "--wait", *args]) as w:
            rec = Recording(record_cmd(out, "--device-dir", str(dev), *standin_driver_args(),
                                       "-p", str(w.pid)))  # fmt: skip
            try:
                attached = rec.wait_line(ATTACHED)  # trackers of seeded fds: before ready
                rec.wait_line(READY)
                t_go = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
                code, wout, werr = w.go()
                assert (code, wout) == (0, "DONE\n"), werr
                rc, _ = rec.finish()
            finally:
                if rec.proc.poll() is None:
                    rec.proc.kill()
                    rec.proc.wait()
        t_end = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    m = json.loads((out / "manifest.json").read_text())
    tables = _tables(out)
    run = _run(2, tables, m, log, exp, w.pid, (t_go, t_go, t_go, t_end))
    return Recorded(run, out, m, tables, rc, rec.proc.pid, {w.pid}, attached)


_DONE: dict[str, Recorded] = {}


@pytest.fixture(params=["command", "pid"])
def rec(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    mode: str = request.param
    if mode not in _DONE:
        tmp = tmp_path_factory.mktemp(mode)
        _DONE[mode] = (_record_command if mode == "command" else _record_pid)(tmp)
    return _DONE[mode]


@pytest.fixture
def cmd_rec(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    if "command" not in _DONE:
        _DONE["command"] = _record_command(tmp_path_factory.mktemp("command"))
    yield _DONE["command"]


# ------------------------------------------------------------ rows vs the stand-in's log
def test_fault_rows_equal_the_log(rec: Recorded) -> None:
    dl.test_gpu_and_cpu_fault_rows_equal_the_log(rec.run)


def test_fault_batches_equal_the_log(rec: Recorded) -> None:
    dl.test_fault_batches_equal_the_log(rec.run)


def test_migrations_equal_the_log(rec: Recorded) -> None:
    dl.test_migrations_equal_the_log(rec.run)


def test_uvm_events_equal_the_log(rec: Recorded) -> None:
    dl.test_uvm_events_equal_the_log(rec.run)


def test_no_drops_and_rows_add_up_to_the_log(rec: Recorded) -> None:
    dl.test_drops_add_up_with_rows_to_the_log(rec.run)


def test_tallies_and_counters_equal_print_expected(rec: Recorded) -> None:
    assert dl._full(rec.run)  # a 64Ki queue loses nothing here: the exact checks all ran
    dl.test_tallies_equal_print_expected(rec.run)


def test_processors_mapped_and_manifest_valid(rec: Recorded) -> None:
    dl.test_processor_indices_map_to_trace_gpu_through_the_uuid_table(rec.run)


def test_rows_inside_the_workload_window(rec: Recorded) -> None:
    dl.test_timestamps_are_monotonic_and_inside_the_workload_window(rec.run)
    start, end = rec.manifest["start_ts_ns"], rec.manifest["end_ts_ns"]
    for name in ("faults", "fault_batches", "migrations", "uvm_events", "gpu_memory"):
        ts = rec.tables[name].column("ts_ns").to_pylist()
        assert start <= min(ts) and max(ts) <= end, name


# ------------------------------------------------------------ one CPU-fault source
def test_cpu_faults_come_from_the_tools_stream_only(rec: Recorded) -> None:
    cpu = [r for r in rec.run.rows("faults") if r["source"] == "cpu"]
    assert len(cpu) == rec.run.expected["cpu_faults"]["write"]
    assert all(r["cpu_id"] is not None for r in cpu)  # a tools record (580 has the CPU id)
    src = rec.manifest["driver_layer"]["cpu_fault_source"]
    assert src["uvm_tools_pids"] == [rec.run.pid] and src["uvm_pids_without_tracker"] == []
    # tools records carry no name: the tracked process's, as the processes table has it
    procs = {r["pid"]: r["comm"] for r in rec.tables["processes"].to_pylist()}
    gpu = [r for r in rec.run.rows("faults") if r["source"] != "cpu"]
    assert procs[rec.run.pid] == "uvm_workload"
    assert {r["comm"] for r in cpu + gpu} == {"uvm_workload"}
    assert "cpu_faults" in rec.manifest["layers"]  # the tracepoint ran; its rows were dropped
    assert src["tracepoint_rows_dropped"] > 0


# ------------------------------------------------------------ RM samples
def test_gpu_memory_sampled_with_the_first_fit_truth_while_fragmented(cmd_rec: Recorded) -> None:
    run, frag = cmd_rec.run, cmd_rec.run.expected["fragmentation"]
    rows = [r for r in run.rows("gpu_memory") if r["gpu_index"] == dl.GPU]
    truth = (frag["heap_size_kib"] << 10, frag["heap_free_kib"] << 10,
             frag["largest_free_kib"] << 10, frag["largest_free_base_kib"] << 10)  # fmt: skip
    during = sorted((r for r in rows if run.t_frag < r["ts_ns"] < run.t_resume),
                    key=lambda r: r["ts_ns"])  # fmt: skip

    def values(r: dict[str, Any]) -> tuple[int, int, int, int]:
        return (r["heap_size_bytes"], r["heap_free_bytes"], r["largest_free_bytes"],
                r["largest_free_base_bytes"])  # fmt: skip

    # rows are stamped at the middle of their query: the last one may have been in
    # flight at the resume and answered after the frees (seen on a loaded host)
    assert any(values(r) == truth for r in during), "no RM sample while fragmented"
    assert all(values(r) == truth and r["status"] == 0 for r in during[:-1])
    assert frag["largest_free_kib"] < frag["heap_free_kib"]
    other = [r for r in run.rows("gpu_memory") if r["gpu_index"] == 0]
    assert other and all(r["heap_free_bytes"] == dl.BUDGET for r in other)


# ------------------------------------------------------------ the recorder itself
def test_the_recorders_own_ioctls_and_fds_are_absent(rec: Recorded) -> None:
    for name in ("ioctls", "files"):
        pids = set(rec.tables[name].column("pid").to_pylist())
        assert pids and pids <= rec.workload_pids, (name, pids)
        assert rec.recorder_pid not in pids
    # the workload asks FB_GET_INFO_V2 exactly twice (fb_check while fragmented and after
    # the frees); the sampler's own queries (two GPUs per sample, at least one sample
    # taken) are all absent. How many samples fit in the run depends on the host's load.
    ioctls = rec.tables["ioctls"].to_pylist()
    ctrl = [r for r in ioctls if r["ctrl_cmd"] == 0x20801303]
    assert all(r["pid"] == rec.run.pid for r in ctrl)
    assert len(ctrl) == 2
    assert rec.manifest["driver_layer"]["rm_client"]["samples"] >= 1
    assert not [r for r in ioctls if r["device"] == "uvm-tools"]
    assert "uvm-tools" not in rec.tables["files"].column("device").to_pylist()


def test_manifest_layers_and_info(rec: Recorded) -> None:
    m = rec.manifest
    assert {"syscall", "uvm_tools", "rm_query"} <= set(m["layers"])
    assert m["driver_layer"]["attach_failures"] == []
    assert sum(v for k, v in m["drops"].items() if k.startswith("uvm_tools:")) == 0
    assert m["decode_errors"].get("uvm_tools") == 0
    out = subprocess.run([*record_cmd(rec.trace)[:3], "info", str(rec.trace)],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert f"trackers   1 attached (pids {rec.run.pid}), 0 failed" in out
    assert "could not be decoded" not in out


def test_missed_before_attach_only_for_the_running_process(rec: Recorded) -> None:
    missed = [x["pid"] for x in rec.manifest["driver_layer"]["missed_before_attach"]]
    assert missed == ([rec.run.pid] if rec.manifest["target"]["mode"] == "pids" else [])


def test_exit_status_passed_through(rec: Recorded) -> None:
    if rec.manifest["target"]["mode"] == "command":
        assert rec.rc == 7
        assert rec.manifest["target_exit"] == {"status": "exited", "code": 7, "signal": None,
                                               "signal_name": None}  # fmt: skip
    else:
        assert rec.rc == 0


def test_analyze_reports_the_driver_layer(rec: Recorded) -> None:
    res = subprocess.run([*record_cmd(rec.trace)[:3], "analyze", str(rec.trace), "--only",
                          "fault-rate,fragmentation", "--format", "json"],
                         capture_output=True, text=True)  # fmt: skip
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    fr, frag, exp = doc["fault_rate"], doc["fragmentation"], rec.run.expected
    assert fr["recorded"] and fr["not_recorded_layers"] == []
    assert sum(b["batches"] for b in fr["batches"]) == exp["gpu_faults"]["batches"]
    assert sum(b["duplicates"] for b in fr["batches"]) == exp["gpu_faults"]["duplicates"]
    assert frag["recorded"] and "rm_query" not in frag["not_recorded_layers"]
    gpus = {g["gpu_index"]: g for g in frag["rm"]["gpus"]}
    assert sorted(gpus) == [0, 1] and gpus[0]["min_free_bytes"] == dl.BUDGET
    if rec.manifest["target"]["mode"] == "command":  # sampled while held fragmented
        truth = exp["fragmentation"]
        assert gpus[1]["min_largest_free_bytes"] == truth["largest_free_kib"] << 10
