"""The ring buffer reader (gputrace/record/ringbuf.py) on a real BPF_MAP_TYPE_RINGBUF
of one page filled by a tiny program: every record comes back byte for byte and in
order, including one that wraps past the end of the data area (read through the
kernel's second mapping of the data pages, in a window of their pages), odd lengths and
discarded records are handled, the ring fills (the program counts its failed outputs
and the reader gets exactly the others) and space is freed for the next records;
with a small window (the most mapped at once) the same records come back, batch after
batch.
Root and bcc (skipped otherwise)."""

from __future__ import annotations

import ctypes
import mmap
import os

import pytest

from gputrace.errors import GputraceError
from gputrace.record import ringbuf

PROGRAM = r"""
struct big { u8 b[1024]; };
struct cfg { u32 pid; u32 len; u32 discard; };
BPF_ARRAY(config, struct cfg, 1);
BPF_ARRAY(src, struct big, 1);
BPF_ARRAY(failed, u64, 1);
BPF_RINGBUF_OUTPUT(events, 1);
TRACEPOINT_PROBE(syscalls, sys_enter_getppid) {
    u32 zero = 0;
    struct cfg *c = config.lookup(&zero);
    struct big *s = src.lookup(&zero);
    if (!c || !s || c->pid != (bpf_get_current_pid_tgid() >> 32)) return 0;
    if (c->discard) {
        void *p = events.ringbuf_reserve(16);
        if (p) events.ringbuf_discard(p, 0);
        return 0;
    }
    u32 n = c->len & 1023;
    if (events.ringbuf_output(s, n, 0)) {
        u64 *f = failed.lookup(&zero);
        if (f) __sync_fetch_and_add(f, 1);
    }
    return 0;
}
"""


class Cfg(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint32), ("len", ctypes.c_uint32),
                ("discard", ctypes.c_uint32)]


@pytest.fixture()
def bpf() -> object:
    from gputrace.record import loader

    if os.geteuid() != 0:
        pytest.skip("needs root")
    try:
        bcc = loader.import_bcc()
    except GputraceError as e:
        pytest.skip(str(e))
    b = bcc.BPF(text=PROGRAM)
    yield b
    b.cleanup()


def emit(b: object, length: int, fill: int, discard: bool = False) -> bytes:
    """One record of `length` bytes, each `fill + i`; returns what was sent."""
    payload = bytes((fill + i) & 0xFF for i in range(length))
    leaf = b["src"].Leaf()  # type: ignore[index]
    ctypes.memmove(leaf.b, payload, length)
    b["src"][ctypes.c_int(0)] = leaf  # type: ignore[index]
    b["config"][ctypes.c_int(0)] = Cfg(os.getpid(), length, int(discard))  # type: ignore[index]
    os.getppid()
    return payload


@pytest.mark.parametrize("window", [ringbuf.WINDOW, 16])
def test_records_come_back_in_order_with_one_wrapping(bpf: object, window: int,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # a 16-byte window: batches of one page, records across pages mapped one by one
    monkeypatch.setattr(ringbuf, "WINDOW", window)
    got: list[bytes] = []
    reader = ringbuf.RingReader(bpf["events"].map_fd, got.append)  # type: ignore[index]
    try:
        assert reader.size == mmap.PAGESIZE
        assert reader.consume() == 0
        sent = [emit(bpf, 1000, k) for k in range(3)]  # positions 0, 1008, 2016
        assert reader.consume() == 3 and got == sent
        got.clear()
        emit(bpf, 16, 0, discard=True)  # 3024: skipped, its space freed
        sent = [emit(bpf, 997, 40)]  # 3048: ends at 4048
        # 4056: header at the end, sample across the wrap; then 13 bytes at the head
        sent += [emit(bpf, 1000, 77), emit(bpf, 13, 5)]
        assert 3048 + 1008 < mmap.PAGESIZE < 4056 + 8 + 1000
        assert reader.available() > 0
        assert reader.consume() == 3 and got == sent
        assert reader.available() == 0
        assert reader.wait(0.0) is False
        emit(bpf, 8, 1)
        assert reader.wait(1.0) is True
    finally:
        reader.close()


def test_a_full_ring_fails_outputs_and_the_reader_gets_the_rest(bpf: object) -> None:
    got: list[bytes] = []
    reader = ringbuf.RingReader(bpf["events"].map_fd, got.append)  # type: ignore[index]
    try:
        reader.consume()
        got.clear()
        bpf["failed"][ctypes.c_int(0)] = ctypes.c_uint64(0)  # type: ignore[index]
        sent = [emit(bpf, 500, k) for k in range(12)]  # 508 bytes, 512 with header
        failed = bpf["failed"][ctypes.c_int(0)].value  # type: ignore[index]
        fit = (mmap.PAGESIZE - 1) // 512  # the kernel keeps used space below the size
        assert failed == 12 - fit
        assert reader.consume() == fit and got == sent[:fit]
        again = emit(bpf, 500, 99)  # the space is free again
        assert reader.consume() == 1 and got[-1] == again
        assert bpf["failed"][ctypes.c_int(0)].value == failed  # type: ignore[index]
    finally:
        reader.close()
