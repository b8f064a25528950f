"""`gputrace record` against a traced process that swaps its uvm fd for a file whose
close never returns.

The workload (a command of the recording) issues UVM_INITIALIZE on the TEST
STAND-IN's nvidia-uvm and at once dup2s a file of a hostile FUSE filesystem
(tests/standin/noflushfs.c: FLUSH is never answered but to the file's openers)
onto that fd number. A recorder that took the fd and closed it would sleep
uninterruptibly in FLUSH, beyond SIGINT, SIGTERM and SIGKILL, and leave the trace
`recording`. The recorder must refuse the file with the reason in the manifest,
finish the trace and exit once the workload exits; the close that hangs is its fd
helper's, never the recorder's. That helper, asleep uninterruptibly in the close, cannot
be ended: the recorder says so on stderr and in the manifest's `helpers_left`, with the
helper's pid and state (D), and does not wait for it.

Needs root, bcc, kernel headers, /dev/fuse and libfuse3; skips with the reason
otherwise. Synchronised on the recorder's lines and the workload's, never on sleeps.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gputrace.record import reap
from gputrace.trace.reader import open_trace
from tests.live.test_record_driver_layer import READY, Recording
from tests.record_helpers import live_skip_reason, record_cmd, standin_driver_args
from tests.standin import standin

_SKIP = live_skip_reason()
pytestmark = [pytest.mark.live]
if _SKIP is not None:
    pytestmark.append(pytest.mark.skip(reason=_SKIP))

NO_TRACKER = "gputrace: warning: driver layer: no tracker on pid "
EXIT_DEADLINE_S = 60.0
"""Bound on the recorder's exit after the workload's (a deadline, not a timing claim:
without the fd check it never exits)."""
WORKLOAD = (
    "import fcntl, os, sys\n"
    "uvm = os.open(sys.argv[1] + '/nvidia-uvm', os.O_RDWR)\n"
    "bad = os.open(sys.argv[2], os.O_RDWR)\n"
    "fcntl.ioctl(uvm, 0x30000001, bytearray(16))  # UVM_INITIALIZE\n"
    "os.dup2(bad, uvm)\n"
    "os.close(bad)\n"
    "print('SWAPPED', uvm, flush=True)\n"
    "sys.stdin.readline()\n"
)


def test_swapped_uvm_fd_is_refused_and_the_recording_ends(tmp_path: Path) -> None:
    """Guards the recorder against a traced process's hostile file at its uvm fd:
    refused (manifest says what it is), trace complete with the workload's
    UVM_INITIALIZE row, recorder exited after the workload, and the one hung FLUSH
    the hostile filesystem saw came from another process than the recorder."""
    out = tmp_path / "t.trace"
    with standin.mounted_driver(tmp_path, gpus=1) as dev:
        with standin.noflush_mount(tmp_path) as hostile:
            rec = Recording(record_cmd(
                out, "--device-dir", str(dev), *standin_driver_args(), "--",
                sys.executable, "-c", WORKLOAD, str(dev), str(hostile.file)))  # fmt: skip
            try:
                rec.wait_line(READY)
                warned = rec.wait_line(NO_TRACKER)
                line = rec.stdout_line()
                assert line.startswith("SWAPPED "), (line, rec.stderr)
                rec.send("\n")
                rc = rec.wait(timeout=EXIT_DEADLINE_S)  # its stderr read to the end
                stdout, _ = rec.proc.communicate(timeout=EXIT_DEADLINE_S)
            finally:
                if rec.proc.poll() is None:
                    rec.proc.kill()  # reaped below, once the hostile server is gone
            hung = hostile.hung_pids()
            # the helper is still asleep in the FLUSH after the recorder's exit (the
            # hostile server is alive): a root process the recording left behind
            stuck = [reap.held_state(p) for p in hung]
        rec.proc.wait(timeout=EXIT_DEADLINE_S)
    assert rc == 0, rec.stderr
    fd = int(line.split()[1])
    assert f"fd {fd} is not the UVM device (a regular file" in warned, warned
    assert len(hung) == 1 and rec.proc.pid not in hung, hung
    assert stuck == ["D"], stuck
    m = json.loads((out / "manifest.json").read_text())
    assert m["status"] == "complete"
    # ...and said: the manifest and stderr name the helper left to the kernel
    assert m["helpers_left"] == [{
        "helper": "fd helper", "pid": hung[0], "state": "D",
        "why": f"asleep uninterruptibly after SIGKILL and {reap.REAP_WAIT_S:g} s"}]
    said = [ln for ln in rec.stderr if "could not be ended" in ln]
    assert said == [f"gputrace: warning: the fd helper (pid {hung[0]}) could not be ended: "
                    f"asleep uninterruptibly after SIGKILL and {reap.REAP_WAIT_S:g} s; it is "
                    "left to the kernel (it holds no part of the trace)\n"], rec.stderr
    wpid = m["target"]["pids"][0]
    fails = m["driver_layer"]["attach_failures"]
    assert [f["pid"] for f in fails] == [wpid], fails
    assert "is not the UVM device" in fails[0]["error"]
    assert m["driver_layer"]["cpu_fault_source"]["uvm_pids_without_tracker"] == [wpid]
    ioctls = open_trace(out).scan("ioctls").collect()
    inits = ioctls.filter((ioctls["pid"] == wpid) & (ioctls["cmd"] == 0x30000001))
    assert inits.height == 1, ioctls
    assert stdout == ""

