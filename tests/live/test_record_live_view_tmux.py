"""`record --live` driven in a real terminal (tmux): the view shows the stand-in
workload's live bytes and allocation counts, and q stops the recording, which
ends complete. Waits on what the pane shows (polled with a deadline), no sleeps
as synchronization (root, bcc, FUSE, tmux)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gputrace.record.recorder import Recorder
from gputrace.trace.reader import open_trace
from tests.record_helpers import READY, ROOT, live_skip_reason, standin_driver_args

pytestmark = [pytest.mark.live]
_SKIP = live_skip_reason()
if _SKIP is None and shutil.which("tmux") is None:
    _SKIP = "tmux is not installed (scripts/setup-record.sh)"
if _SKIP is None and not hasattr(Recorder, "add_observer"):
    _SKIP = "the recorder has no add_observer yet"
if _SKIP is not None:
    pytestmark.append(pytest.mark.skip(reason=_SKIP))


class Tmux:
    """One tmux server of our own (its own socket) with one detached session."""

    def __init__(self, command: str) -> None:
        self.sock = f"gputrace-test-{os.getpid()}"
        subprocess.run(["tmux", "-L", self.sock, "new-session", "-d", "-s", "t", "-x", "200",
                        "-y", "50", command], check=True, cwd=ROOT)  # fmt: skip

    def pane(self) -> str:
        r = subprocess.run(["tmux", "-L", self.sock, "capture-pane", "-p", "-t", "t"],
                           capture_output=True, text=True)  # fmt: skip
        return r.stdout

    def keys(self, *keys: str) -> None:
        subprocess.run(["tmux", "-L", self.sock, "send-keys", "-t", "t", *keys], check=True)

    def until(self, cond: Callable[[str], bool], timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            text = self.pane()
            if cond(text):
                return text
            if time.monotonic() > deadline:
                raise AssertionError(f"pane never showed it:\n{text}")
            time.sleep(0.1)

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.sock, "kill-server"], capture_output=True)


def row_of(text: str, pid: int) -> list[str]:
    """The process table's row of pid, split on its column borders."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.replace("│", "|").split("|")]
        if str(pid) in cells:
            return [c for c in cells if c]
    return []


def test_live_view_in_tmux(tmp_path: Path) -> None:
    from tests.standin.standin import mounted_driver
    from tests.standin_cuda.standin_cuda import waiting_workload

    out = tmp_path / "trace"
    rc_file = tmp_path / "rc"
    with mounted_driver(tmp_path, budget=256 << 20) as dev, \
            waiting_workload("--hold", devdir=dev) as w:
        argv = [sys.executable, "-m", "gputrace.cli", "record", "--live", "-o", str(out),
                "-p", str(w.pid), "--device-dir", str(dev), *standin_driver_args()]
        env = f"PYTHONPATH={shlex.quote(str(ROOT))} COLUMNS=200 LINES=50"
        tmux = Tmux(f"env {env} {shlex.join(argv)}; echo $? > {shlex.quote(str(rc_file))}")
        try:
            tmux.until(lambda t: "gputrace live" in t and READY in t)
            assert w.proc.stdin is not None and w.proc.stdout is not None
            w.proc.stdin.write("go\n")
            w.proc.stdin.flush()
            assert any(x.strip() == "DONE" for x in w.proc.stdout)
            # API 23 MiB leaked (23 x 1 MiB), RM 24 MiB (12 blocks of 2 MiB), UVM 24 MiB
            # (their mappings); allocations 42 API + 22 RM + 21 UVM (20 external mappings,
            # 1 managed mmap) = 85, frees 19 API + 10 RM + 9 UVM (8 UVM_FREE, 1 munmap) =
            # 38 (expected.json); held: the one figure (the 12 RM objects every pointer
            # and mapping lies in: 24 MiB), then the per-layer breakdown
            text = tmux.until(lambda t: row_of(t, w.pid)[6:8] == ["85", "38"])
            row = row_of(text, w.pid)
            assert row[1:8] == ["cuda_workload", "24.0 MiB", "23.0 MiB", "24.0 MiB",
                                "24.0 MiB", "85", "38"], row
            assert f"top growing: {w.pid} cuda_workload" in text
            tmux.keys("g")  # sort by growth: the header says so
            tmux.until(lambda t: "sort: growth" in t)
            tmux.keys("q")
            deadline = time.monotonic() + 60
            while not rc_file.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert rc_file.read_text().strip() == "0", tmux.pane()
        finally:
            tmux.kill()
            assert w.proc.stdin is not None
            w.proc.stdin.close()
    t = open_trace(out)
    assert t.status == "complete"
    assert t.rows("cuda_calls") > 0
