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


ZOMBIE_C = ROOT / "tests" / "standin_cuda" / "zombie_program.c"
GET_PID_INFO = "cmd 0x2080018e"
"""The stand-in driver's verbose log line of a NV2080_CTRL_CMD_GPU_GET_PID_INFO."""


def _pid_info_answers(log: Path) -> int:
    return log.read_text(errors="replace").count(GET_PID_INFO)


def _wait_answers(log: Path, more_than: int, timeout: float = 30.0) -> None:
    """Until the driver has answered more GET_PID_INFOs than `more_than` (a condition
    the recorder's rm_query poll makes true; the deadline only bounds a broken run)."""
    import time

    deadline = time.monotonic() + timeout
    while _pid_info_answers(log) <= more_than:
        assert time.monotonic() < deadline, "the recorder asked the driver nothing"
        time.sleep(0.01)


def test_a_zombie_the_driver_still_charges(tmp_path: Path) -> None:
    """A CUDA program's main thread exits alone while a thread keeps its device files:
    `ps` shows it <defunct>, the stand-in driver's per-process accounting (the truth)
    still charges it what it allocated, and the holders report names it with that
    figure, orphaned. The recorder (`-p`) is stopped once the driver has been asked
    after the kernel showed the zombie."""
    from tests.record_helpers import RecorderProc
    from tests.standin.standin import mounted_driver, read_state, started_waiting
    from tests.standin_cuda.standin_cuda import link_program, workload_env

    exe = link_program(ZOMBIE_C, tmp_path / "zombie_program")
    size = 6 << 20  # a multiple of the stand-in's 2 MiB blocks: one RM allocation
    out = tmp_path / "trace"
    with (mounted_driver(tmp_path, budget=1 << 30, verbose=True) as dev,
          started_waiting([str(exe), str(size)], env=workload_env(dev)) as w):
        rec = RecorderProc(record_cmd(out, "--device-dir", str(dev), *standin_driver_args(),
                                      "-p", str(w.pid)))
        rec.wait_ready()
        assert w.proc.stdin is not None and w.proc.stdout is not None
        w.proc.stdin.write("go\n")
        w.proc.stdin.flush()
        assert w.proc.stdout.readline().split() == ["ZOMBIE", str(w.pid), "Z"]
        # the kernel's view: the main thread a zombie, one thread alive
        status = Path(f"/proc/{w.pid}/status").read_text()
        assert "State:\tZ (zombie)" in status and "Threads:\t2" in status
        # the driver's books: the vidmem of the clients this pid made
        st = read_state(dev)
        mine = {c["handle"] for c in st.clients if c["pid"] == w.pid}
        truth = sum(o["size"] for o in st.objects
                    if o["client"] in mine and o["kind"] == "vid")  # fmt: skip
        assert truth == size
        # a whole rm_query round (GET_PIDS, GET_PID_INFO) asked after the zombie was seen
        _wait_answers(tmp_path / "nvfuse.log", _pid_info_answers(tmp_path / "nvfuse.log") + 1)
        rec.proc.send_signal(signal.SIGINT)
        assert rec.wait(timeout=120) == 0, "".join(rec.stderr)
        w.proc.stdin.close()  # the thread lets go: the process ends
        assert w.proc.wait(timeout=30) == 0
    pm = open_trace(out).scan("gpu_process_memory").collect()
    assert truth in set(pm.filter(pm["pid"] == w.pid)["vidmem_bytes"])
    rep = analyze(out, ["holders"])["holders"]
    end = rep["instants"][0]
    assert end["at"] == "end" and end["holders"] == []
    (case,) = end["cases"]
    assert (case["case"], case["pid"], case["bytes"], case["bytes_from"], case["orphaned"]) == (
        "zombie", w.pid, truth, "driver", True)
    assert rep["orphaned_bytes"] == truth
    assert case["verdict"].startswith(
        f"zombie_program (pid {w.pid}) is a zombie: its main thread exited ")
    assert ("while 1 other thread ran on, keeping its device files; the driver still "
            "charges it 6.0 MiB") in case["verdict"]
    procs = open_trace(out).scan("processes").collect()
    assert 1 in set(procs.filter(procs["pid"] == w.pid)["zombie_threads"])


def test_recording_a_command_that_becomes_a_zombie(tmp_path: Path) -> None:
    """`record -- zombie_program`: the command's main thread exits alone. The recorder
    must not wait for it (its thread runs on: a wait would block the writer until the
    thread ends); Ctrl-C ends the recording while the zombie still holds its files,
    and the trace calls it a zombie with one thread."""
    from tests.record_helpers import RecorderProc
    from tests.standin.standin import mounted_driver
    from tests.standin_cuda.standin_cuda import link_program, workload_env

    exe = link_program(ZOMBIE_C, tmp_path / "zombie_program")
    out = tmp_path / "trace"
    with mounted_driver(tmp_path, budget=1 << 30) as dev:
        rec = RecorderProc(record_cmd(out, "--device-dir", str(dev), *standin_driver_args(),
                                      "--", str(exe), str(2 << 20)),
                           stdin=subprocess.PIPE, env=workload_env(dev))
        try:
            rec.wait_ready()
            assert rec.proc.stdin is not None and rec.proc.stdout is not None
            assert rec.proc.stdout.readline().split()[0] == "READY"
            rec.proc.stdin.write("go\n")
            rec.proc.stdin.flush()
            zombie, pid, state = rec.proc.stdout.readline().split()
            assert (zombie, state) == ("ZOMBIE", "Z")
            rec.proc.send_signal(signal.SIGINT)
            assert rec.wait(timeout=120) == 0, "".join(rec.stderr)
            assert Path(f"/proc/{pid}").exists()  # the recording ended before the zombie
        finally:
            if rec.proc.stdin is not None:
                rec.proc.stdin.close()  # its thread's stdin: the zombie ends
            rec.proc.kill()
    procs = open_trace(out).scan("processes").collect()
    row = procs.filter((procs["pid"] == int(pid)) & procs["exit_ts_ns"].is_not_null())
    assert list(row["zombie_threads"]) == [1]
