"""The recorder takes a traced process's uvm fd only when it is the UVM device.

A traced process chooses what lies at the fd number the probe saw: after
UVM_INITIALIZE it can dup2 any file there. These tests put other files there
(/dev/null, a regular file, another character device, and a file of a hostile FUSE
filesystem that never answers FLUSH) and check that the tracker refuses them with
the reason, that this process never holds them, and, for the hostile file, that
its hanging close costs the recorder nothing (it happens in the fd helper).
Needs root (pidfd_getfd on another process); the FUSE case also needs /dev/fuse
and libfuse3 (tests/standin) and skips with the reason otherwise.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gputrace.record import fdtake, reap
from gputrace.record.driver_version import parse_version
from gputrace.record.uvm_tools import abi as uvm_tools_abi
from gputrace.record.uvm_tools import tracker as uvm_tools
from tests import uvm_fake
from tests.standin import standin

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="pidfd_getfd of another process needs root")

ABI = uvm_tools_abi.tools_abi(parse_version("580.159.04"))
PLANT = ("import os, sys; fd = os.open(sys.argv[1], os.O_RDWR); "
         "bad = os.open(sys.argv[2], os.O_RDWR); os.dup2(bad, fd); os.close(bad); "
         "print(fd, flush=True); sys.stdin.read()")  # fmt: skip


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> uvm_fake.FakeToolsDriver:
    """SYNTHETIC driver: accepts INIT_EVENT_TRACKER on any uvmFd, so only the fd
    check can refuse one."""
    drv = uvm_fake.FakeToolsDriver()
    monkeypatch.setattr(uvm_tools, "ioctl", drv.ioctl)
    return drv


@pytest.fixture
def devdir(tmp_path: Path) -> Path:
    d = tmp_path / "dev"
    d.mkdir()
    for name in ("nvidia-uvm", "nvidia-uvm-tools"):
        (d / name).write_bytes(b"")
    return d


@contextmanager
def planted(uvm: Path, other: Path | str) -> Iterator[tuple[int, int]]:
    """A SYNTHETIC target that opened `uvm` and then put `other` at that fd number:
    (pid, fd)."""
    p = subprocess.Popen([sys.executable, "-c", PLANT, str(uvm), str(other)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert p.stdout is not None
        yield p.pid, int(p.stdout.readline())
    finally:
        p.kill()
        p.wait()


def _my_fds_on(path: Path | str) -> list[int]:
    out = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == str(path):
                out.append(int(name))
        except OSError:
            pass
    return out


@pytest.mark.parametrize("other", ["/dev/null", "regular"])
def test_tracker_refuses_a_file_dup2ed_onto_the_uvm_fd(
    fake: uvm_fake.FakeToolsDriver, devdir: Path, tmp_path: Path, other: str
) -> None:
    """Guards the fd check: a target that dup2s another file onto the fd the probe
    saw gets no tracker (the driver would be handed a file it chose), the reason
    names what the file is, and this process never holds that file."""
    path = Path(other) if other.startswith("/") else tmp_path / "planted"
    if not other.startswith("/"):
        path.write_bytes(b"")
    with planted(devdir / "nvidia-uvm", path) as (pid, fd):
        with pytest.raises(uvm_tools.ToolsError) as e:
            uvm_tools.Tracker.open(pid, str(devdir), ABI, 1024, fds=[fd])
        assert _my_fds_on(path) == [] or other == "/dev/null"
    what = "a character device 1:3" if other == "/dev/null" else "a regular file on device"
    assert f"fd {fd} is not the UVM device ({what}" in str(e.value)
    inits = (uvm_tools_abi.TOOLS_INIT_EVENT_TRACKER, uvm_tools_abi.TOOLS_INIT_EVENT_TRACKER_V2)
    assert not [c for c in fake.calls if c[1] in inits], "an INIT reached the driver"


def test_a_character_device_node_matches_by_device_number(tmp_path: Path) -> None:
    """Guards the real-host check: /dev/nvidia-uvm is recognised by its device number
    (a container's node of its own is the same device), and another character device
    is refused."""
    node = tmp_path / "nvidia-uvm"
    os.mknod(node, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # /dev/null's number
    taker = fdtake.FdTaker(fdtake.device_identity(str(node)))
    try:
        with planted(node, "/dev/null") as (pid, fd):
            pidfd = os.pidfd_open(pid)
            try:
                got = taker.take(pidfd, fd)
                assert os.fstat(got).st_rdev == os.makedev(1, 3)
                os.close(got)
            finally:
                os.close(pidfd)
        with planted(node, "/dev/zero") as (pid, fd):
            pidfd = os.pidfd_open(pid)
            try:
                with pytest.raises(fdtake.TakeError, match=r"a character device 1:5"):
                    taker.take(pidfd, fd)
            finally:
                os.close(pidfd)
    finally:
        taker.close()


_FUSE_SKIP = standin.skip_reason()


@pytest.mark.skipif(_FUSE_SKIP is not None, reason=_FUSE_SKIP or "")
def test_a_file_whose_flush_never_returns_costs_the_recorder_nothing(
    devdir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Guards the hang: a target dup2s a file of its own FUSE filesystem, which never
    answers FLUSH, onto its uvm fd. Taking it is refused at once, the close that
    hangs is the fd helper's (its pid is the one the filesystem logs, never ours),
    this process never holds the file, and ending the helper does not wait on it: it
    is killed, and, held by the kernel beyond SIGKILL, said on stderr and kept for the
    manifest."""
    with standin.noflush_mount(tmp_path) as hostile:
        taker = fdtake.FdTaker(fdtake.device_identity(str(devdir / "nvidia-uvm")))
        taker.start()
        helper = taker._proc
        assert helper is not None
        with planted(devdir / "nvidia-uvm", hostile.file) as (pid, fd):
            pidfd = os.pidfd_open(pid)
            t0 = time.monotonic()
            try:
                with pytest.raises(fdtake.TakeError, match=r"is not the UVM device \(a regular"):
                    taker.take(pidfd, fd)
            finally:
                os.close(pidfd)
            assert time.monotonic() - t0 < fdtake.TIMEOUT_S
            assert _my_fds_on(hostile.file) == []
            deadline = time.monotonic() + 10
            while helper.pid not in hostile.hung_pids():
                assert time.monotonic() < deadline, hostile.log.read_text()
                time.sleep(0.01)
            assert hostile.hung_pids() == [helper.pid]
        t0 = time.monotonic()
        reap.take_left()
        taker.close()
        assert time.monotonic() - t0 < fdtake.EXIT_WAIT_S + reap.REAP_WAIT_S + 1.0
        assert helper.poll() is None  # still stuck in that close, beyond SIGKILL: only it
        # ...and said: on stderr and for the manifest, with its state
        assert reap.take_left() == [{
            "helper": "fd helper", "pid": helper.pid, "state": "D",
            "why": f"asleep uninterruptibly after SIGKILL and {reap.REAP_WAIT_S:g} s"}]
        err = capsys.readouterr().err
        assert f"the fd helper (pid {helper.pid}) could not be ended" in err
    # the hostile server is gone: the stuck close returns and the helper ends (its own
    # exit on EOF came first when its main thread had left: 0; else the kill's)
    assert helper.wait(timeout=10) in (0, -9)
