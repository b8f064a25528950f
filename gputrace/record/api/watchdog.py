"""Continues the processes the API probe stopped, whatever ends the recorder.

The API probe stops a traced process with SIGSTOP (probes/cuda.bpf.c) when it
opens libcuda or makes its first call, and records it in the `cuda_paused` map;
the recorder attaches, reads its maps and sends SIGCONT. A recorder killed
between the two would leave the process stopped for good, so `start` runs this
file as a small separate process that holds a descriptor of that map (the map
outlives the recorder; the programs, whose descriptors it does not hold, are
detached when the recorder's descriptors close) and a pidfd of the recorder.
The recorder also tells it (`hold`) about a stopped process before taking it
out of the map to continue it. When the recorder has exited (any cause, SIGKILL
included), or says it is done, the watchdog continues every process the map
still lists as stopped and every one held, then exits.

A process is continued only through a pidfd, and only when it is stopped and
started no later than the stop (`stop_boot_ns`, CLOCK_BOOTTIME): a pid reused
by a newer process is never signalled.

Standard library only: it runs as `python -I watchdog.py RECORDER_PID MAP_FD`.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import struct
import subprocess
import sys

PAUSE = struct.Struct("<QIiIIQ")  # struct cuda_pause in probes/gputrace_events.h
"""ts_ns, kinds, fd, stopped, _pad0, stop_boot_ns."""
_BPF_NR = {"x86_64": 321, "aarch64": 280, "riscv64": 280, "ppc64le": 361, "s390x": 351}
_BPF_MAP_LOOKUP_ELEM, _BPF_MAP_GET_NEXT_KEY = 1, 4
READY, DONE = b"ready\n", b"done\n"


def _start_ticks(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks since boot) from /proc/PID/stat."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    # fields[0] is field 3 (state); starttime is field 22
    return fields[0].decode(), int(fields[19])


def _boot_offset_ns() -> int:
    """This time namespace's CLOCK_BOOTTIME offset (/proc/PID/stat adds it)."""
    with contextlib.suppress(OSError, ValueError, IndexError), open(
        "/proc/self/timens_offsets"
    ) as f:
        for line in f:
            name, sec, nsec = line.split()
            if name == "boottime":
                return int(sec) * 10**9 + int(nsec)
    return 0


def wait_stopped(pid: int, timeout_s: float) -> bool:
    """Wait (bounded) until `pid` is in state T: the probe's SIGSTOP takes effect
    only when the thread leaves the probe for user space, and a process continued
    before it has stopped would stop for good. False when it did not stop (gone)."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        st = _start_ticks(pid)
        if st is None or st[0] in ("Z", "X"):
            return False
        if st[0] in ("T", "t"):  # t: a debugger holds it; waiting would not help
            return st[0] == "T"
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.0002)


def continue_stopped(pid: int, stop_boot_ns: int) -> bool:
    """SIGCONT to `pid` if it is the process stopped at `stop_boot_ns` (CLOCK_BOOTTIME)
    and still stopped; True when the signal was sent."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return False
    try:
        # Read after the pidfd is held: a process that started no later than the
        # stop held this pid then, so it is the pidfd's process, not a newer one.
        st = _start_ticks(pid)
        if st is None or st[0] != "T":
            return False
        tick_ns = 10**9 // os.sysconf("SC_CLK_TCK")
        if st[1] * tick_ns - _boot_offset_ns() > stop_boot_ns:
            return False
        signal.pidfd_send_signal(pidfd, signal.SIGCONT)
        return True
    except OSError:
        return False
    finally:
        os.close(pidfd)


def _bpf(libc: ctypes.CDLL, cmd: int, map_fd: int, key: ctypes.Array[ctypes.c_char] | None,
         out: ctypes.Array[ctypes.c_char]) -> bool:
    attr = struct.pack("<IIQQQ", map_fd, 0, ctypes.addressof(key) if key is not None else 0,
                       ctypes.addressof(out), 0)  # fmt: skip
    buf = ctypes.create_string_buffer(attr, len(attr))
    nr = _BPF_NR.get(os.uname().machine)
    if nr is None:
        return False
    return int(libc.syscall(ctypes.c_long(nr), ctypes.c_long(cmd), buf,
                            ctypes.c_uint(len(attr)))) == 0  # fmt: skip


def read_paused(map_fd: int) -> dict[int, tuple[int, int]]:
    """{pid: (stopped flag, stop_boot_ns)} from a `cuda_paused` map descriptor."""
    libc = ctypes.CDLL(None, use_errno=True)
    out: dict[int, tuple[int, int]] = {}
    key: ctypes.Array[ctypes.c_char] | None = None
    nxt = ctypes.create_string_buffer(4)
    val = ctypes.create_string_buffer(PAUSE.size)
    for _ in range(1 << 16):  # the map holds at most 4096 entries
        if not _bpf(libc, _BPF_MAP_GET_NEXT_KEY, map_fd, key, nxt):
            break
        key = ctypes.create_string_buffer(nxt.raw, 4)
        pid = struct.unpack("<I", key.raw)[0]
        if _bpf(libc, _BPF_MAP_LOOKUP_ELEM, map_fd, key, val):
            _ts, _kinds, _fd, stopped, _pad, boot = PAUSE.unpack(val.raw)
            out[pid] = (stopped, boot)
    return out


def main(argv: list[str]) -> int:
    """Wait for the recorder to end, then continue whoever is still stopped.

    Lines on stdin: `hold PID BOOT_NS` (the recorder is about to take PID out of
    the map and continue it), `forget PID` (it did), `done` (it closed its
    programs and continued everyone: check and exit).
    """
    recorder, map_fd = int(argv[1]), int(argv[2])
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    held: dict[int, int] = {}
    try:
        rec_fd = os.pidfd_open(recorder)
        alive = os.getppid() == recorder  # else it died before the pidfd was taken
    except OSError:
        rec_fd, alive = -1, False
    if alive:
        os.write(1, READY)
        poll = select.poll()
        poll.register(rec_fd, select.POLLIN)
        poll.register(0, select.POLLIN)
        pending, done = b"", False
        while not done:
            for fd, _ev in poll.poll():
                if fd == rec_fd:
                    done = True  # the recorder has exited and its descriptors are closed
                    continue
                chunk = os.read(0, 4096)
                if not chunk:
                    # EOF without "done": the recorder is dying; its programs are
                    # detached only once it has fully exited (rec_fd readable)
                    poll.unregister(0)
                    continue
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    word = line.split()
                    if word[:1] == [b"hold"] and len(word) == 3:
                        held[int(word[1])] = int(word[2])
                    elif word[:1] == [b"forget"] and len(word) == 2:
                        held.pop(int(word[1]), None)
                    elif word == [b"done"]:
                        done = True
    for pid, (stopped, boot) in read_paused(map_fd).items():
        if stopped:
            held.setdefault(pid, boot)
    for pid, boot in held.items():
        continue_stopped(pid, boot)
    return 0


class Watchdog:
    """The watchdog process, seen from the recorder (`hold` before a stopped
    process leaves the map, `forget` once it was continued, `done` at the end)."""

    def __init__(self, map_fd: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-I", os.path.abspath(__file__), str(os.getpid()), str(map_fd)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=[map_fd],
            start_new_session=True,  # a Ctrl-C to the recorder's group does not reach it
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # bounded by the child's start-up
        if line != READY:
            self.proc.kill()
            self.proc.wait()
            raise OSError("the watchdog that continues stopped processes did not start")

    def _say(self, text: str) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(OSError):
            self.proc.stdin.write(text.encode() + b"\n")
            self.proc.stdin.flush()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def hold(self, pid: int, stop_boot_ns: int) -> None:
        self._say(f"hold {pid} {stop_boot_ns}")

    def forget(self, pid: int) -> None:
        self._say(f"forget {pid}")

    def done(self) -> None:
        """The recorder released every process itself: let the watchdog check and exit."""
        self._say("done")
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
