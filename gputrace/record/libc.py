"""The few libc calls the driver-layer clients make through ctypes: an ioctl with its
parameter struct in place, anonymous memory (mmap, munmap, madvise) and
`pidfd_getfd(2)`, which Python's os module does not offer.

Shared by the UVM tools tracker (`uvm_tools`) and the RM client (`rm_client`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

SYS_PIDFD_GETFD = 438  # same number on x86-64 and the generic (arm64) table

LIBC = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
LIBC.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
LIBC.ioctl.restype = ctypes.c_int
LIBC.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long]  # fmt: skip
LIBC.mmap.restype = ctypes.c_void_p
LIBC.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
LIBC.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
LIBC.syscall.restype = ctypes.c_long

PROT_RW = 0x1 | 0x2
MAP_PRIVATE_ANON = 0x02 | 0x20
MADV_DONTFORK = 10
MAP_FAILED = ctypes.c_void_p(-1).value
PAGE = os.sysconf("SC_PAGE_SIZE")


def ioctl(fd: int, cmd: int, params: ctypes.Structure) -> None:
    """Issue one ioctl with `params` in place; OSError when the syscall fails."""
    if LIBC.ioctl(fd, cmd, ctypes.addressof(params)) < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def pidfd_open(pid: int) -> int:
    """A pidfd of `pid` (readable once it exits)."""
    return os.pidfd_open(pid)


def pidfd_getfd(pidfd: int, target_fd: int) -> int:
    """A duplicate, in this process, of fd `target_fd` of the process behind `pidfd`."""
    fd = LIBC.syscall(SYS_PIDFD_GETFD, pidfd, target_fd, 0)
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return int(fd)
