"""Host-mode `gputrace record` (no -p, no CMD) names every job: a stand-in workload
started from a shell during the recording, inside a cgroup made here, gets its exact
ppid, exe, cmdline, cgroup and a start time inside the recording; one whose shell was
running before the recording began gets ppid, exe and cmdline from /proc and no start
time. The exported trace is then selected by those fields with `fleet analyze --where`.
Live: real BPF probes on the FUSE stand-in driver (root)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from gputrace.record import procfs
from gputrace.trace.reader import open_trace
from tests.cli_helpers import cli
from tests.record_helpers import RecorderProc, live_skip_reason, record_cmd, standin_driver_args

pytestmark = [pytest.mark.live]
_SKIP = live_skip_reason()
if _SKIP is not None:
    pytestmark.append(pytest.mark.skip(reason=_SKIP))


@contextmanager
def cgroup(name: str) -> Iterator[str | None]:
    """A fresh cgroup v2 directory (its path as /proc/PID/cgroup shows it), or None
    where cgroup2 is not mounted or not writable."""
    mount = procfs._cgroup2_mount(procfs.CGROUP2)
    path = mount / name if mount is not None else None
    try:
        if path is not None:
            path.mkdir()
    except OSError:
        path = None
    try:
        yield None if path is None or mount is None else "/" + name
    finally:
        if path is not None:
            for _ in range(100):  # rmdir fails until the kernel has moved the exited pids out
                try:
                    path.rmdir()
                    break
                except OSError:
                    time.sleep(0.05)  # polling a condition (bounded), not a timing assertion


def ready_pid(proc: subprocess.Popen[str]) -> int:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("READY "), line
    return int(line.split()[1])


def wait_for_ioctls_of(trace: Path, pid: int, timeout: float = 60.0) -> None:
    """Until a written part of `ioctls` holds a row of `pid`: the recorder consumed that
    process's first events (and, on its poll thread, read its /proc facts) by then."""
    deadline = time.monotonic() + timeout
    while True:
        for part in (trace / "ioctls").glob("part-*.parquet"):
            try:
                if pl.read_parquet(part, columns=["pid"])["pid"].eq(pid).any():
                    return
            except Exception:  # a part being written: read it again next round
                continue
        assert time.monotonic() < deadline, f"no ioctl row of {pid} within {timeout} s"
        time.sleep(0.05)  # polling a condition with a deadline


def test_host_mode_rows_name_jobs_started_during_and_before(tmp_path: Path,
                                                            dask_scheduler: str) -> None:
    from tests.standin.standin import build, mounted_driver

    wl = str(build("workload").workload)
    out = tmp_path / "trace"
    with mounted_driver(tmp_path, budget=1 << 30) as dev, \
            cgroup(f"gputrace-test-{os.getpid()}") as cg:  # fmt: skip
        # already running before the recording: a shell that execs the workload when told
        before = subprocess.Popen(["/bin/sh", "-c", f'read line; exec "{wl}" "{dev}" --wait'],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        rec = RecorderProc(record_cmd(out, "--device-dir", str(dev), *standin_driver_args(),
                                      "-d", "300"))  # fmt: skip
        try:
            rec.wait_ready()
            join = f'echo $$ > "{procfs._cgroup2_mount(procfs.CGROUP2)}{cg}/cgroup.procs" && ' \
                if cg is not None else ""  # fmt: skip
            shell = subprocess.Popen(["/bin/sh", "-c", f'{join}"{wl}" "{dev}" --wait --repeat 2;'
                                      ' echo "exit $?"'], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)  # fmt: skip
            during = ready_pid(shell)
            assert before.stdin is not None and shell.stdin is not None
            before.stdin.write("exec\n")
            before.stdin.flush()
            assert ready_pid(before) == before.pid
            wait_for_ioctls_of(out, during)
            wait_for_ioctls_of(out, before.pid)
            # short-lived: it may be gone before the recorder reads /proc
            quick = subprocess.run(["/bin/sh", "-c", f'"{wl}" "{dev}" & echo "pid $! $$"; wait $!;'
                                    ' echo "exit $?"'], capture_output=True, text=True,
                                   timeout=60, check=True)  # fmt: skip
            assert quick.stdout.endswith("DONE\nexit 0\n"), quick.stdout
            short, its_shell = map(int, quick.stdout.split()[1:3])
            said = {}
            for p in (shell, before):
                said[p.pid], _ = p.communicate("go\n", timeout=60)
                assert p.returncode == 0, said[p.pid]
            assert said[shell.pid].endswith("DONE\nexit 0\n"), said[shell.pid]
            rec.proc.send_signal(signal.SIGINT)
            assert rec.wait(timeout=120) == 0, "".join(rec.stderr)
        finally:
            for p in (before, rec.proc):
                if p.poll() is None:
                    p.kill()
    t = open_trace(out)
    m = t.manifest
    assert m["target"] == {"mode": "host"} and str(uuid.UUID(m["trace_id"])) == m["trace_id"]
    procs = {r["pid"]: r for r in t.scan("processes").collect().to_dicts()}
    real = os.path.realpath(wl)
    a = procs[during]
    assert a["ppid"] == shell.pid
    assert (a["exe"], a["cmdline"]) == (real, f"{wl} {dev} --wait --repeat 2")
    assert m["start_ts_ns"] < a["start_ts_ns"] < a["exit_ts_ns"] <= m["end_ts_ns"]
    assert a["exit_code"] == 0 and a["comm"] == "workload"
    if cg is not None:
        assert a["cgroup"] == cg and a["container_id"] is None
    # what the probes kept is exact; what only /proc could say is exact or null
    c = procs[short]
    assert c["ppid"] == its_shell
    assert m["start_ts_ns"] < c["start_ts_ns"] < c["exit_ts_ns"] <= m["end_ts_ns"]
    assert c["exe"] in (real, None) and c["cmdline"] in (f"{wl} {dev}", None)
    assert c["cgroup"] in (procfs.cgroup_path(Path("/proc/self/cgroup").read_text()), None)
    b = procs[before.pid]
    assert b["ppid"] == os.getpid() and b["start_ts_ns"] is None  # predates the recording
    assert (b["exe"], b["cmdline"]) == (real, f"{wl} {dev} --wait")
    assert b["exit_ts_ns"] is not None and b["comm"] == "workload"
    _fleet_selects_by_job(tmp_path, out, a, b, cg, dask_scheduler)


def _fleet(ds: Path, where: str, scheduler: str) -> dict[str, Any]:
    """`fleet analyze` in this process, on the module's local cluster (tests/conftest.py)."""
    r = cli("fleet", "analyze", str(ds), "--scheduler", scheduler, "-f", "json",
            "--per-trace", "--where", where)  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


def _pids(doc: dict[str, Any]) -> set[int]:
    return {p["pid"] for t in doc["per_trace"] for p in t["report"]["summary"]["processes"]}


def _fleet_selects_by_job(tmp_path: Path, trace: Path, a: dict[str, Any], b: dict[str, Any],
                          cg: str | None, scheduler: str) -> None:  # fmt: skip
    ds = tmp_path / "ds"
    r = cli("export", str(trace), "--to", str(ds))
    assert r.returncode == 0, r.stderr
    index = json.loads((ds / "manifest.json").read_text())
    assert list(index["traces"]) == [open_trace(trace).manifest["trace_id"]]
    q = a["cmdline"].replace("'", "\\'")
    doc = _fleet(ds, f"cmdline = '{q}'", scheduler)
    assert doc["traces"] == 1 and _pids(doc) == {a["pid"]}
    doc = _fleet(ds, f"exe = '{b['exe']}' and ppid = {b['ppid']}", scheduler)
    assert doc["traces"] == 1 and _pids(doc) == {b["pid"]}
    doc = _fleet(ds, "cmdline ~ 'repeat 2$' or exe ~ '^/no/such/'", scheduler)
    assert _pids(doc) == {a["pid"]}
    if cg is not None:
        assert _pids(_fleet(ds, f"cgroup = '{cg}'", scheduler)) == {a["pid"]}
    assert _fleet(ds, "exe = '/no/such/exe'", scheduler)["traces"] == 0


def _pending_pids(trace: Path) -> list[int]:
    """Pids in the processes table's PENDING rows (empty while there are none)."""
    try:
        return pl.read_parquet(trace / "processes" / "pending.parquet",
                               columns=["pid"])["pid"].to_list()  # fmt: skip
    except Exception:  # not written yet, or being replaced: read it again next round
        return []


def test_sigkilled_recorder_keeps_the_rows_of_running_processes(tmp_path: Path) -> None:
    """Guards the SIGKILL loss of the processes table: a workload seen during the
    recording and still running has its row on disk from the next rotation (the
    recorder's PENDING rows are what the test waits on); after SIGKILL and `gputrace
    convert` the processes table holds its row, with its facts and no exit."""
    from tests.standin import standin

    out = tmp_path / "trace"
    with standin.mounted_driver(tmp_path, budget=1 << 30) as dev:
        rec = RecorderProc(record_cmd(out, "--device-dir", str(dev), *standin_driver_args(),
                                      "-d", "300"))  # fmt: skip
        try:
            rec.wait_ready()
            with standin.waiting_workload(dev) as w:
                deadline = time.monotonic() + 60
                while w.pid not in _pending_pids(out):
                    assert time.monotonic() < deadline, "".join(rec.stderr)
                    time.sleep(0.05)  # polling the recorder's output with a deadline
                rec.proc.send_signal(signal.SIGKILL)
                rec.wait(timeout=60)
                w.go()
        finally:
            if rec.proc.poll() is None:
                rec.proc.kill()
                rec.proc.wait()
    assert json.loads((out / "manifest.json").read_text())["status"] == "recording"
    r = cli("convert", str(out))
    assert r.returncode == 0, r.stderr
    rows = open_trace(out).scan("processes").collect().filter(pl.col("pid") == w.pid)
    assert rows.height == 1, rows
    row = rows.row(0, named=True)
    assert row["comm"] == "workload" and row["exit_ts_ns"] is None
    assert row["exe"] is not None and row["exe"].endswith("/workload")
    assert row["cmdline"] is not None and "--wait" in row["cmdline"]
