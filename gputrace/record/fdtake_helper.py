"""The recorder's fd-taking helper process: takes a traced process's fd with
`pidfd_getfd(2)`, checks it is the NVIDIA UVM device, and hands back only that.

Run by `fdtake.FdTaker` as `python3 -I fdtake_helper.py SOCKFD IDENTITY` (standard
library only: it is started by path, outside the package). Why a process of its
own: a traced process can put any file at the fd number the probe saw, e.g. one
of its own FUSE filesystem that never answers FLUSH. Every close of an fd on such
a file (and the exit of the last process holding one) sleeps uninterruptibly in
FLUSH, beyond SIGKILL; a thread of the recorder stuck there would keep the
recorder from ever exiting. So only this helper ever holds a file it has not
checked; the check reads the cached attributes (`statx` with
AT_STATX_DONT_SYNC: no request reaches the file's filesystem), and a refused file
is closed by a daemon thread here, so a close that never returns costs one stuck
thread in a process the recorder never waits for.

Protocol (SOCK_SEQPACKET): a request is the target fd number (4 bytes) with the
target's pidfd attached (SCM_RIGHTS); the reply is `ok` with the taken fd
attached, or `no:` and the reason. IDENTITY is `chr:RDEV` (a character device of
that device number: a real /dev/nvidia-uvm) or `file:DEV:INO` (that very file: the
test stand-in's nvidia-uvm, a file of its FUSE filesystem).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import queue
import signal
import socket
import stat
import struct
import sys
import threading

SYS_PIDFD_GETFD = 438
AT_EMPTY_PATH = 0x1000
AT_STATX_DONT_SYNC = 0x4000
STATX_TYPE, STATX_MODE, STATX_INO = 0x1, 0x2, 0x100

LIBC = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
LIBC.syscall.restype = ctypes.c_long


class Statx(ctypes.Structure):
    """`struct statx` up to the device numbers (the kernel's is 256 bytes)."""

    _fields_ = [
        ("mask", ctypes.c_uint32), ("blksize", ctypes.c_uint32),
        ("attributes", ctypes.c_uint64), ("nlink", ctypes.c_uint32),
        ("uid", ctypes.c_uint32), ("gid", ctypes.c_uint32), ("mode", ctypes.c_uint16),
        ("_spare0", ctypes.c_uint16), ("ino", ctypes.c_uint64), ("size", ctypes.c_uint64),
        ("blocks", ctypes.c_uint64), ("attributes_mask", ctypes.c_uint64),
        ("_times", ctypes.c_uint8 * 64),
        ("rdev_major", ctypes.c_uint32), ("rdev_minor", ctypes.c_uint32),
        ("dev_major", ctypes.c_uint32), ("dev_minor", ctypes.c_uint32),
        ("_rest", ctypes.c_uint8 * 112),
    ]  # fmt: skip


def cached_stat(fd: int) -> tuple[int, int, int, int]:
    """(mode, dev, ino, rdev) of the file behind `fd` from the kernel's cached
    attributes: AT_STATX_DONT_SYNC keeps FUSE (and network filesystems) from asking
    their server, which a hostile server could leave unanswered."""
    st = Statx()
    rc = LIBC.statx(fd, b"", AT_EMPTY_PATH | AT_STATX_DONT_SYNC,
                    STATX_TYPE | STATX_MODE | STATX_INO, ctypes.byref(st))  # fmt: skip
    if rc < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return (st.mode, os.makedev(st.dev_major, st.dev_minor), st.ino,
            os.makedev(st.rdev_major, st.rdev_minor))  # fmt: skip


def describe(mode: int, dev: int, rdev: int) -> str:
    """What a refused file is, in words (numbers only: nothing the target named)."""
    if stat.S_ISCHR(mode):
        return f"a character device {os.major(rdev)}:{os.minor(rdev)}"
    kinds = {stat.S_IFREG: "a regular file", stat.S_IFIFO: "a pipe", stat.S_IFSOCK: "a socket",
             stat.S_IFDIR: "a directory", stat.S_IFBLK: "a block device"}  # fmt: skip
    kind = kinds.get(stat.S_IFMT(mode), f"a file of mode {mode:o}")
    return f"{kind} on device {os.major(dev)}:{os.minor(dev)}"


def matches(identity: str, mode: int, dev: int, ino: int, rdev: int) -> bool:
    """Is (mode, dev, ino, rdev) the file IDENTITY names?"""
    kind, _, rest = identity.partition(":")
    if kind == "chr":
        return stat.S_ISCHR(mode) and rdev == int(rest)
    if kind == "file":
        want_dev, want_ino = (int(x) for x in rest.split(":"))
        return not stat.S_ISCHR(mode) and (dev, ino) == (want_dev, want_ino)
    return False


def take(pidfd: int, target_fd: int, identity: str) -> tuple[int, str]:
    """(fd, "") when fd `target_fd` of the process behind `pidfd` is the UVM device;
    else (-1, why) with any fd taken queued for the closer thread."""
    fd = int(LIBC.syscall(SYS_PIDFD_GETFD, pidfd, target_fd, 0))
    if fd < 0:
        return -1, f"pidfd_getfd(fd {target_fd}): {os.strerror(ctypes.get_errno())}"
    try:
        mode, dev, ino, rdev = cached_stat(fd)
    except OSError as e:
        CLOSER.put(fd)
        return -1, f"fd {target_fd}: statx: {e.strerror}"
    if not matches(identity, mode, dev, ino, rdev):
        CLOSER.put(fd)
        return -1, f"fd {target_fd} is not the UVM device ({describe(mode, dev, rdev)})"
    return fd, ""


CLOSER: queue.SimpleQueue[int] = queue.SimpleQueue()


def closer() -> None:
    """Close refused files, one at a time, off the thread that answers requests:
    such a close may never return."""
    while True:
        fd = CLOSER.get()
        with contextlib.suppress(OSError):
            os.close(fd)


def serve(sock: socket.socket, identity: str) -> None:
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, 16, 1)
        except OSError:
            return
        if not data:  # the recorder closed its end
            return
        if len(data) != 4 or len(fds) != 1:
            for fd in fds:
                CLOSER.put(fd)
            sock.send(b"no:malformed request")
            continue
        (target_fd,) = struct.unpack("i", data)
        fd, why = take(fds[0], target_fd, identity)
        os.close(fds[0])  # a pidfd: closing it runs nothing of the target's
        if fd >= 0:
            socket.send_fds(sock, [b"ok"], [fd])
            os.close(fd)  # the UVM device, checked: its close is the driver's
        else:
            sock.send(b"no:" + why.encode())


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the recorder says when to stop
    sock = socket.socket(fileno=int(argv[1]))
    threading.Thread(target=closer, name="gputrace-fd-closer", daemon=True).start()
    serve(sock, argv[2])
    # A refused file's close may be stuck: leave without waiting for it (the
    # recorder does not wait for this process either).
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
