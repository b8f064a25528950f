"""Live: `record -- CMD` where CMD opens the NVIDIA device files (the FUSE stand-in),
forks a child that keeps them, and exits at once. The recording covers the child
until it lets go of them (it used to stop with CMD: the child was missing from
`processes`), and the holders report says who held what when it ended (root)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gputrace.trace.reader import open_trace
from tests.analyze_helpers import analyze
from tests.record_helpers import ROOT, live_skip_reason, record_cmd, standin_driver_args

pytestmark = [pytest.mark.live]
_SKIP = live_skip_reason()
if _SKIP is not None:
    pytestmark.append(pytest.mark.skip(reason=_SKIP))

# CMD: opens two device files, forks; the parent prints both pids and exits at once;
# the child keeps the fds for HOLD_S seconds, closes them (or holds them forever with
# HOLD_S < 0), then lingers a little without them.
SCRIPT = """
import os, sys, time
d, hold = sys.argv[1], float(sys.argv[2])
ctl = os.open(d + "/nvidiactl", os.O_RDWR)
uvm = os.open(d + "/nvidia-uvm", os.O_RDWR)
kid = os.fork()
if kid:
    print(os.getpid(), kid, flush=True)
    os._exit(0)
null = os.open(os.devnull, os.O_RDWR)  # the test reads our pipes to their end
os.dup2(null, 1); os.dup2(null, 2)
if hold < 0:
    time.sleep(3600)
time.sleep(hold)
os.close(uvm); os.close(ctl)
time.sleep(0.3)
"""


def _record(tmp_path: Path, hold: float, *extra: str) -> tuple[Any, int, int, str]:
    from tests.standin.standin import mounted_driver

    out = tmp_path / "trace"
    with mounted_driver(tmp_path, budget=1 << 30) as dev:
        r = subprocess.run(
            record_cmd(out, "--device-dir", str(dev), *standin_driver_args(), *extra, "--",
                       sys.executable, "-c", SCRIPT, str(dev), str(hold)),
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        parent, child = (int(x) for x in r.stdout.split())
        if hold < 0:  # the child outlived the recording: end it before the unmount
            os.kill(child, signal.SIGKILL)
    assert r.returncode == 0, r.stderr
    return open_trace(out), parent, child, r.stderr


def test_recording_covers_the_child_until_it_lets_go(tmp_path: Path) -> None:
    t, parent, child, err = _record(tmp_path, 1.5)
    assert t.status == "complete"
    procs = t.scan("processes").collect()
    kid = procs.filter(procs["pid"] == child).row(0, named=True)
    assert kid["ppid"] == parent
    # the child's closes of the two inherited fds are in the trace, after CMD's exit
    files = t.scan("files").collect()
    closes = files.filter((files["pid"] == child) & (files["fd_op"] == "close"))
    assert closes.height == 2
    cmd_exit = procs.filter(procs["pid"] == parent)["exit_ts_ns"][0]
    assert cmd_exit is not None and closes["ts_ns"].min() > cmd_exit
    assert "recording goes on while 1 of its processes hold its GPU device files" in err
    # nobody held them when the recording ended
    (end,) = analyze(t.path, ["holders"])["holders"]["instants"]
    assert end["holders"] == [] and end["cases"] == []


def test_the_report_names_the_child_keeping_them(tmp_path: Path) -> None:
    """The child holds them past `-d 2`: the recording ends at the duration, and the
    holders report names the child, the opener (CMD) and that CMD exited."""
    t, parent, child, _ = _record(tmp_path, -1, "-d", "2")
    (end,) = analyze(t.path, ["holders"])["holders"]["instants"]
    assert [(h["pid"], h["fds"], h["opened_by"]) for h in end["holders"]] == [
        (child, 2, [parent])]
    (case,) = end["cases"]
    assert (case["case"], case["pid"], case["holders"], case["orphaned"]) == (
        "inherited", parent, [child], True)
    assert case["verdict"].startswith(f"1 python3 process (pid {child}) forked from ")


def _free_pid() -> int:
    """A pid no process of this host has (the driver names it; the trace never sees it)."""
    pid = 4_000_000
    while os.path.exists(f"/proc/{pid}"):
        pid += 1
    return pid


def test_a_pid_of_another_namespace_the_driver_lists(tmp_path: Path) -> None:
    """The stand-in driver's GET_PIDS lists a pid no traced process has, charged 64 MiB
    (its own accounting is the truth): the holders report calls it unseen, orphaned."""
    from tests.standin.standin import mounted_driver

    pid, vid = _free_pid(), 64 << 20
    out = tmp_path / "trace"
    with mounted_driver(tmp_path, budget=1 << 30, foreign=(pid, vid)) as dev:
        r = subprocess.run(
            record_cmd(out, "--device-dir", str(dev), *standin_driver_args(), "-d", "2"),
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert r.returncode == 0, r.stderr
    t = open_trace(out)
    pm = t.scan("gpu_process_memory").collect()
    assert pm.height > 0 and set(pm["pid"]) == {pid} and set(pm["vidmem_bytes"]) == {vid}
    rep = analyze(out, ["holders"])["holders"]
    # Host mode hears every process: another test's program failing a call at the same time
    # adds an incident instant; the end of the trace is always the first.
    end = rep["instants"][0]
    assert end["at"] == "end"
    (case,) = end["cases"]
    assert (case["case"], case["pid"], case["bytes"], case["orphaned"]) == (
        "unseen", pid, vid, True)
    assert rep["orphaned_bytes"] == vid
    assert case["verdict"].startswith(f"pid {pid}: the driver charges it 64.0 MiB")
