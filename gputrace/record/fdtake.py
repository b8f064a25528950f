"""Taking a traced process's UVM fd without ever holding a file it chose.

The probe saw `UVM_INITIALIZE` on fd N of a process; by the time the recorder takes
fd N (`pidfd_getfd`), the process may have put anything there, e.g. a file of its
own FUSE filesystem that never answers FLUSH, whose close sleeps uninterruptibly,
beyond SIGKILL, and whose last holder cannot even exit. So the recorder never takes
an fd itself: `FdTaker` asks a helper process (`fdtake_helper`), which takes it,
checks it is the NVIDIA UVM device (from cached attributes: nothing reaches the
file's filesystem) and passes back only that file. A refused file stays in the
helper, whose own daemon thread closes it; the recorder waits for an answer at
most `TIMEOUT_S`, and for the helper's end at most EXIT_WAIT_S and then
`reap.REAP_WAIT_S` after killing it.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import stat
import struct
import subprocess
import sys
from pathlib import Path

from gputrace.record import reap

HELPER = Path(__file__).with_name("fdtake_helper.py")
TIMEOUT_S = 5.0
"""How long one answer of the helper is waited for (it does no blocking work: a
late answer means it is broken, and it is replaced; the first answer may also
wait for the helper's start)."""
EXIT_WAIT_S = 0.5


class TakeError(Exception):
    """The fd could not be taken, or is not the UVM device; the message says why."""


def device_identity(node: str) -> str:
    """The helper's IDENTITY of the device node `node`: `chr:RDEV` for a character
    device (any node of that device number is the device, in any mount or container),
    else `file:DEV:INO` (the test stand-in's FUSE file: that very file).
    TakeError when the node cannot be read."""
    try:
        st = os.stat(node)
    except OSError as e:
        raise TakeError(f"{node}: {e.strerror}") from None
    if stat.S_ISCHR(st.st_mode):
        return f"chr:{st.st_rdev}"
    return f"file:{st.st_dev}:{st.st_ino}"


class FdTaker:
    """A helper process that takes fds of traced processes for the recorder."""

    def __init__(self, identity: str) -> None:
        self.identity = identity
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the helper now (else at the first `take`)."""
        if self._sock is None:
            self._start()

    def _start(self) -> socket.socket:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            # -I: no user site or PYTHONPATH for a root helper; its own session and
            # no inherited stdio: a helper left stuck never holds a terminal's signals
            # or the pipes a caller of the recorder waits on
            self._proc = subprocess.Popen(
                [sys.executable, "-I", str(HELPER), str(theirs.fileno()), self.identity],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        except OSError as e:
            mine.close()
            raise TakeError(f"cannot start the fd helper: {e.strerror}") from None
        finally:
            theirs.close()
        self._sock = mine
        return mine

    def take(self, pidfd: int, target_fd: int) -> int:
        """This process's fd on fd `target_fd` of the process behind `pidfd`, only
        when that is the UVM device; TakeError (with why) otherwise."""
        sock = self._sock or self._start()
        try:
            socket.send_fds(sock, [struct.pack("i", target_fd)], [pidfd])
            ready, _, _ = select.select([sock], [], [], TIMEOUT_S)
            if not ready:
                raise TimeoutError
            data, fds, _flags, _addr = socket.recv_fds(sock, 256, 1)
        except (OSError, TimeoutError):
            self._abandon()
            raise TakeError(f"fd {target_fd}: the fd helper did not answer") from None
        if data == b"ok" and len(fds) == 1:
            return fds[0]
        for fd in fds:  # never sent with a refusal; a received fd is the checked device
            os.close(fd)
        if not data:
            self._abandon()
            raise TakeError(f"fd {target_fd}: the fd helper ended")
        why = data.removeprefix(b"no:").decode("ascii", "replace")
        raise TakeError(why)

    def _abandon(self) -> None:
        """Drop a helper that stopped answering (kill it, never wait for it); the
        next take starts a new one."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            with contextlib.suppress(OSError):
                self._proc.kill()
            self._proc = None

    def close(self) -> None:
        """End the helper: it exits on EOF within EXIT_WAIT_S, else it is killed and
        reaped (`reap.end`); one stuck closing a refused file beyond SIGKILL is said
        on stderr and in the manifest, and never waited for longer."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            proc = self._proc
            self._proc = None
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(EXIT_WAIT_S)
            if proc.returncode is None:
                reap.end("fd helper", proc.pid, proc.kill, lambda t: _waited(proc, t))


def _waited(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return False
    return True


__all__ = ["FdTaker", "TakeError", "device_identity"]
