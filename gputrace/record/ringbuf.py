"""Read a BPF ring buffer (BPF_MAP_TYPE_RINGBUF) with its data area mapped once.

libbpf (bcc's `open_ring_buffer`) maps each data area twice, back to back, so that a
record wrapping past the end reads as one contiguous block: every ring then costs its
size twice in the recorder's resident memory. This reader maps the consumer page
read-write and the producer page plus the data area read-only, once, and copies a
record that wraps in two slices. The protocol is the kernel's (kernel/bpf/ringbuf.c):
each record is an 8-byte header (u32 length with the BUSY and DISCARD bits, u32 page
offset) followed by the sample, padded to 8 bytes; the producer position is read
before the headers, the consumer position is written after the batch.
"""

from __future__ import annotations

import ctypes
import mmap
import select
import struct
from collections.abc import Callable

from gputrace.errors import GputraceError

BUSY_BIT = 1 << 31  # the producer reserved the record and has not committed it yet
DISCARD_BIT = 1 << 30  # committed as discarded: skipped, never handed on
HEADER = 8
_LEN_MASK = ~(BUSY_BIT | DISCARD_BIT) & 0xFFFFFFFF
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


def max_entries(fd: int) -> int:
    """The data area's size of the map behind `fd` (its `max_entries`)."""
    try:
        with open(f"/proc/self/fdinfo/{fd}") as f:
            for line in f:
                if line.startswith("max_entries:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    raise GputraceError(f"cannot read the size of the ring buffer map (fd {fd})")


class RingReader:
    """One ring buffer map `fd`, mapped once; `consume()` hands each committed record's
    bytes to `on_record` in order and frees their space. One thread consumes a reader."""

    def __init__(self, fd: int, on_record: Callable[[bytes], object]) -> None:
        self.fd = fd
        self.on_record = on_record
        page = mmap.PAGESIZE
        size = max_entries(fd)
        if size <= 0 or size & (size - 1) or size % page:
            raise GputraceError(f"ring buffer map (fd {fd}): odd size {size}")
        self.size, self._mask = size, size - 1
        try:
            self._cons_map = mmap.mmap(fd, page, mmap.MAP_SHARED,
                                       mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
            # the producer page then the data area, read-only: the kernel allows this
            # partial mapping (the double one is libbpf's choice, not the kernel's)
            self._data_map = mmap.mmap(fd, page + size, mmap.MAP_SHARED, mmap.PROT_READ,
                                       offset=page)
        except OSError as e:
            raise GputraceError(f"cannot map the ring buffer (fd {fd}): {e}") from None
        # aligned 8-byte loads and stores through ctypes are single instructions: on
        # x86-64 a load is an acquire and a store a release, as the protocol needs
        self._cons = ctypes.c_uint64.from_buffer(self._cons_map)
        self._view = memoryview(self._data_map)
        self._data = self._view[page:]
        self._page = page
        self._poll: select.epoll | None = None

    def producer_pos(self) -> int:
        return int(_U64.unpack_from(self._view, 0)[0])

    def available(self) -> int:
        """Bytes committed or reserved and not yet consumed."""
        return self.producer_pos() - int(self._cons.value)

    def consume(self) -> int:
        """Hand every committed record on, in order; returns how many were handed on.
        Stops at the first record still being written (BUSY): the next call takes it."""
        cons = start = int(self._cons.value)
        data, mask, size, unpack, cb = self._data, self._mask, self.size, _U32.unpack_from, \
            self.on_record
        n = 0
        while True:
            prod = int(_U64.unpack_from(self._view, 0)[0])
            if cons >= prod:
                break
            while cons < prod:
                off = cons & mask
                (hdr,) = unpack(data, off)  # the header never wraps: 8-aligned in 2^k
                if hdr & BUSY_BIT:
                    prod = -1
                    break
                length = hdr & _LEN_MASK
                if not hdr & DISCARD_BIT:
                    begin = off + HEADER
                    end = begin + length
                    if end <= size:
                        cb(bytes(data[begin:end]))
                    else:  # wraps: the tail of the area, then its head
                        begin &= mask
                        if begin + length <= size:
                            cb(bytes(data[begin:begin + length]))
                        else:
                            cb(bytes(data[begin:]) + bytes(data[: end - size]))
                    n += 1
                cons += (length + HEADER + 7) & ~7
            if prod < 0:
                break
        if cons != start:
            self._cons.value = cons  # after the batch: the producer may reuse it now
        return n

    def wait(self, timeout_s: float) -> bool:
        """Sleep until data is there (epoll on the map) or `timeout_s` passed."""
        if self._poll is None:
            self._poll = select.epoll()
            self._poll.register(self.fd, select.EPOLLIN)
        return bool(self._poll.poll(timeout_s))

    def close(self) -> None:
        """Unmap (the map itself is its program's)."""
        if self._poll is not None:
            self._poll.close()
            self._poll = None
        del self._cons
        self._data.release()
        self._view.release()
        self._data_map.close()
        self._cons_map.close()


class RingSet:
    """The rings of a layer, consumed together (what bcc's `ring_buffer_consume` did)."""

    def __init__(self) -> None:
        self.readers: list[RingReader] = []

    def open(self, fd: int, on_record: Callable[[bytes], object]) -> RingReader:
        reader = RingReader(fd, on_record)
        self.readers.append(reader)
        return reader

    def consume(self) -> int:
        return sum(r.consume() for r in self.readers)

    def close(self) -> None:
        for r in self.readers:
            r.close()
        self.readers.clear()
