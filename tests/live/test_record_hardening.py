"""The recorder never leaves a process stopped, never runs CMD when it cannot
record, and passes CMD's exit status through.

The watchdog tests use a real BPF hash map laid out as `cuda_paused` (made with
the bpf syscall, no bcc) and real stopped processes; the live tests (bcc, the
stand-ins) record for real and kill the recorder at the moment it holds a
process stopped.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gputrace.record import recorder as rec_mod
from gputrace.record.api import watchdog
from gputrace.record.recorder import Options, Recorder, exit_status
from gputrace.trace.reader import open_trace
from tests.record_helpers import ROOT, RecorderProc, live_skip_reason, record_cmd

_ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (bpf maps, other users)")
DEADLINE_S = 30.0  # bound on polls for a state change; never a timing assertion


def run_record(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gputrace.cli", "record", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def state(pid: int) -> str | None:
    """The one-letter state of /proc/PID/stat (None once the process is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2 :].split()[0].decode()


def wait_state(pid: int, want: set[str | None], what: str) -> str | None:
    deadline = time.monotonic() + DEADLINE_S
    while (s := state(pid)) not in want:
        assert time.monotonic() < deadline, f"{what}: pid {pid} still in state {s}"
        time.sleep(0.02)  # polling a condition with a deadline
    return s


# ------------------------------------------------------------------ a cuda_paused map
_BPF_NR = {"x86_64": 321, "aarch64": 280}


def _bpf(cmd: int, attr: bytes) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(attr, len(attr))
    r = int(libc.syscall(ctypes.c_long(_BPF_NR[os.uname().machine]), ctypes.c_long(cmd), buf,
                         ctypes.c_uint(len(attr))))  # fmt: skip
    if r < 0:
        raise OSError(ctypes.get_errno(), "bpf")
    return r


def make_paused_map() -> int:
    """A BPF hash map shaped like `cuda_paused` (u32 pid -> struct cuda_pause)."""
    return _bpf(0, struct.pack("<IIIII", 1, 4, watchdog.PAUSE.size, 64, 0))  # MAP_CREATE


def put_pause(map_fd: int, pid: int, stopped: int, stop_boot_ns: int) -> None:
    key = ctypes.create_string_buffer(struct.pack("<I", pid), 4)
    val = ctypes.create_string_buffer(
        watchdog.PAUSE.pack(0, 2, -1, stopped, 0, stop_boot_ns), watchdog.PAUSE.size
    )
    _bpf(2, struct.pack("<IIQQQ", map_fd, 0, ctypes.addressof(key), ctypes.addressof(val), 0))


def boot_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


@contextlib.contextmanager
def stopped_sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A `sleep` in state T (SIGSTOP), killed on the way out."""
    p = subprocess.Popen(["sleep", "300"])
    try:
        os.kill(p.pid, signal.SIGSTOP)
        wait_state(p.pid, {"T"}, "SIGSTOP")
        yield p
    finally:
        p.kill()
        p.wait()


# A stand-in recorder: starts the watchdog on an inherited map, says its pid, then
# obeys lines on stdin ("hold PID BOOT", "forget PID", "done") and waits to be killed.
FAKE_RECORDER = """
import sys
from gputrace.record.api.watchdog import Watchdog
w = Watchdog(int(sys.argv[1]))
print(w.proc.pid, flush=True)
for line in sys.stdin:
    word = line.split()
    if word[0] == "hold":
        w.hold(int(word[1]), int(word[2]))
    elif word[0] == "done":
        w.done()
    print("ok", flush=True)
"""


@contextlib.contextmanager
def fake_recorder(map_fd: int) -> Iterator[tuple[subprocess.Popen[str], int]]:
    p = subprocess.Popen([sys.executable, "-c", FAKE_RECORDER, str(map_fd)], cwd=ROOT,
                         pass_fds=[map_fd], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)  # fmt: skip
    try:
        assert p.stdout is not None
        yield p, int(p.stdout.readline())
    finally:
        p.kill()
        p.wait()


def say(p: subprocess.Popen[str], line: str) -> None:
    assert p.stdin is not None and p.stdout is not None
    p.stdin.write(line + "\n")
    p.stdin.flush()
    assert p.stdout.readline() == "ok\n"


def gone(pid: int) -> None:
    wait_state(pid, {None, "Z"}, "watchdog exit")


@_ROOT_ONLY
@pytest.mark.live
def test_watchdog_continues_stopped_target_when_recorder_is_killed() -> None:
    fd = make_paused_map()
    try:
        with stopped_sleeper() as target, fake_recorder(fd) as (rec, wd_pid):
            put_pause(fd, target.pid, 1, boot_ns())
            rec.kill()  # SIGKILL: no cleanup of its own
            wait_state(target.pid, {"S", "R"}, "watchdog SIGCONT")
            gone(wd_pid)
    finally:
        os.close(fd)


@_ROOT_ONLY
@pytest.mark.live
def test_watchdog_continues_held_target_gone_from_the_map() -> None:
    """The recorder took the entry out of the map and died before its SIGCONT."""
    fd = make_paused_map()
    try:
        with stopped_sleeper() as target, fake_recorder(fd) as (rec, wd_pid):
            say(rec, f"hold {target.pid} {boot_ns()}")
            assert state(target.pid) == "T"
            rec.kill()
            wait_state(target.pid, {"S", "R"}, "watchdog SIGCONT")
            gone(wd_pid)
    finally:
        os.close(fd)


@_ROOT_ONLY
@pytest.mark.live
def test_watchdog_never_signals_a_newer_process_on_a_listed_pid() -> None:
    """An entry whose stop is older than the process now holding the pid (a reused
    pid) is left alone, as is an entry not marked stopped."""
    fd = make_paused_map()
    try:
        with stopped_sleeper() as newer, stopped_sleeper() as other:
            put_pause(fd, newer.pid, 1, 1)  # "stopped" at boot + 1 ns: before it existed
            put_pause(fd, other.pid, 0, boot_ns())  # not stopped by the probe
            with fake_recorder(fd) as (rec, wd_pid):
                rec.kill()
                gone(wd_pid)
            assert state(newer.pid) == "T" and state(other.pid) == "T"
    finally:
        os.close(fd)


@_ROOT_ONLY
@pytest.mark.live
def test_watchdog_done_exits_and_ignores_terminal_signals() -> None:
    fd = make_paused_map()
    try:
        with fake_recorder(fd) as (rec, wd_pid):
            os.kill(wd_pid, signal.SIGINT)  # a Ctrl-C meant for the recorder
            os.kill(wd_pid, signal.SIGTERM)
            assert state(wd_pid) not in (None, "Z")
            say(rec, "done")
            gone(wd_pid)
    finally:
        os.close(fd)


def test_continue_stopped_refuses_a_running_process() -> None:
    p = subprocess.Popen(["sleep", "300"])
    try:
        wait_state(p.pid, {"S", "R"}, "start")
        assert not watchdog.continue_stopped(p.pid, boot_ns())  # not stopped: no signal
        assert not watchdog.continue_stopped(1 << 22, boot_ns())  # no such pid
    finally:
        p.kill()
        p.wait()


# ------------------------------------------------------------------ CMD never runs
def _marker_cmd(tmp_path: Path) -> tuple[Path, list[str]]:
    marker = tmp_path / "ran"
    return marker, ["--", "sh", "-c", f"touch {marker}"]


def _refused(r: subprocess.CompletedProcess[str], code: int, text: str) -> None:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == code, r.stderr
    assert len(lines) == 1 and lines[0].startswith("gputrace: error:"), r.stderr
    assert text in lines[0], lines[0]


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (["-d", "nan"], "-d: cannot read 'nan'"),
        (["-d", "inf"], "-d: cannot read 'inf'"),
        (["-d", "-1"], "-d cannot be negative"),
        (["-d", "1e300"], "-d must be from"),
        (["-d", "0"], "-d must be from"),
        (["-p", "1", "-d", "1"], "either -p PID or -- CMD"),
    ],
)
def test_bad_numbers_are_usage_errors_before_cmd(tmp_path: Path, args: list[str],
                                                  text: str) -> None:  # fmt: skip
    marker, cmd = _marker_cmd(tmp_path)
    _refused(run_record("-o", str(tmp_path / "t"), *args, *cmd), 2, text)
    assert not marker.exists() and not (tmp_path / "t").exists()


@_ROOT_ONLY
@pytest.mark.parametrize(
    ("case", "code", "text"),
    [
        ("exists", 1, "already exists"),
        ("force_not_trace", 1, "not a trace"),
        ("parent_is_file", 1, "Not a directory"),
        ("libcuda_missing", 2, "--libcuda"),
        ("device_dir_missing", 2, "--device-dir"),
        ("driver_version", 2, "bad --driver-version"),
        ("command_missing", 2, "command not found"),
    ],
)
def test_refusals_leave_no_cmd(tmp_path: Path, case: str, code: int, text: str) -> None:
    marker, cmd = _marker_cmd(tmp_path)
    out = tmp_path / "t"
    args = ["-o", str(out)]
    if case == "exists":
        out.mkdir(mode=0o700)
    elif case == "force_not_trace":
        out.mkdir(mode=0o700)
        (out / "notes.json").write_text("{}")
        args.append("--force")
    elif case == "parent_is_file":
        (tmp_path / "file").write_text("x")
        args = ["-o", str(tmp_path / "file" / "t")]
    elif case == "libcuda_missing":
        args += ["--libcuda", str(tmp_path / "libcuda.so.1")]
    elif case == "device_dir_missing":
        args += ["--device-dir", str(tmp_path / "nodev")]
    elif case == "driver_version":
        args += ["--driver-version", "5x0"]
    elif case == "command_missing":
        cmd = ["--", str(tmp_path / "no-such-command")]
    _refused(run_record(*args, *cmd), code, text)
    assert not marker.exists()
    if case == "force_not_trace":
        assert (out / "notes.json").exists()  # nothing of someone else's removed


def test_unreleased_cmd_is_ended_not_run(tmp_path: Path) -> None:
    """A failure after CMD was started but before it was let go: CMD is killed
    while still blocked, so none of it runs."""
    marker, cmd = _marker_cmd(tmp_path)
    r = Recorder(Options(output=str(tmp_path / "t"), command=cmd[1:]))
    r._spawn(cmd[1:])
    assert r.child is not None
    r._stop_unreleased()
    assert r.child.returncode == -signal.SIGKILL
    assert not marker.exists()


def test_recorder_death_before_release_never_runs_cmd(tmp_path: Path) -> None:
    """The start gate's pipe closing without "go" (the recorder died) ends CMD's shim."""
    marker = tmp_path / "ran"
    r, w = os.pipe()
    p = subprocess.Popen([sys.executable, "-c", rec_mod.SHIM, str(r), "sh", "-c",
                          f"touch {marker}"], pass_fds=[r])  # fmt: skip
    os.close(r)
    os.close(w)
    assert p.wait(timeout=60) == 125
    assert not marker.exists()


def test_exit_status_as_shells_report_it() -> None:
    assert exit_status(None) == 0
    assert exit_status({"status": "running"}) == 0
    assert exit_status({"status": "exited", "code": 3}) == 3
    assert exit_status({"status": "signaled", "signal": 11}) == 139


# ------------------------------------------------------------------ live recordings
_LIVE_SKIP = live_skip_reason()
live_only = pytest.mark.skipif(_LIVE_SKIP is not None, reason=str(_LIVE_SKIP))


@pytest.mark.live
@live_only
@pytest.mark.parametrize(
    ("script", "rc", "ended"),
    [
        ("exit 3", 3, {"status": "exited", "code": 3, "signal": None, "signal_name": None}),
        ("kill -TERM $$", 128 + 15,
         {"status": "signaled", "code": None, "signal": 15, "signal_name": "SIGTERM"}),
    ],
)
def test_record_returns_cmd_status(tmp_path: Path, script: str, rc: int,
                                   ended: dict[str, object]) -> None:  # fmt: skip
    out = tmp_path / "t"
    r = subprocess.run(record_cmd(out, "--", "sh", "-c", script), cwd=ROOT,
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == rc, r.stderr
    t = open_trace(out)
    assert t.status == "complete"
    assert t.manifest["target_exit"] == ended
    assert t.manifest["decode_errors"] == dict.fromkeys(t.manifest["decode_errors"], 0)
    procs = t.scan("processes").collect()
    assert procs.filter(procs["pid"] == t.manifest["target"]["pids"][0]).height == 1


@pytest.mark.live
@live_only
def test_sigkilled_recorder_never_leaves_target_stopped(tmp_path: Path) -> None:
    """The moment a target is held stopped is made certain by stopping the recorder
    first: the probe then stops the target (dlopen of libcuda) and nobody continues
    it until the recorder is SIGKILLed and its watchdog does."""
    from tests.standin_cuda.standin_cuda import waiting_workload

    out = tmp_path / "trace"
    with waiting_workload("--quiet", dlopen=True) as w:
        rec = RecorderProc(record_cmd(out, "-p", str(w.pid)))
        rec.wait_ready()
        # the recorder's children: its watchdog, and the unwind-table compile worker
        # with multiprocessing's resource tracker; none may outlive it
        kids = [int(x) for x in Path(f"/proc/{rec.proc.pid}/task/{rec.proc.pid}/children")
                .read_text().split()]  # fmt: skip
        wd = [k for k in kids if "watchdog" in Path(f"/proc/{k}/cmdline").read_text()]
        assert len(wd) == 1, [Path(f"/proc/{k}/cmdline").read_text() for k in kids]
        rec.proc.send_signal(signal.SIGSTOP)
        assert w.proc.stdin is not None
        w.proc.stdin.write("go\n")
        w.proc.stdin.flush()
        wait_state(w.pid, {"T"}, "probe stop at the libcuda open")
        rec.proc.send_signal(signal.SIGKILL)
        rec.wait(timeout=60)
        wait_state(w.pid, {"S", "R", "D", "Z", None}, "continued by the watchdog")
        stdout, err = w.proc.communicate(timeout=60)
        assert w.proc.returncode == 0, err
        assert "LOADED" in stdout
        for k in kids:
            gone(k)
    info = subprocess.run([sys.executable, "-m", "gputrace.cli", "info", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["status"] == "recording"
