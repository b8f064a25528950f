"""Read a BPF ring buffer (BPF_MAP_TYPE_RINGBUF) mapping only the part that holds records.

libbpf (bcc's `open_ring_buffer`) maps each data area twice, back to back, so that a
record wrapping past the end reads as one contiguous block: every ring then counts
twice its size in the recorder's resident memory, though the kernel holds it once. This
reader keeps the consumer page (read-write) and the producer page (read-only) mapped,
and at each `consume` maps read-only only the pages between the two positions, copies
the records out and unmaps them: the data areas' pages are the kernel's memory, no
longer in the recorder's RSS or PSS but for a batch being read. The kernel maps the data
pages twice in its own address space (kernel/bpf/ringbuf.c), so a window that runs past
the end of the area is one contiguous mapping and a record that wraps reads in one
piece. The protocol is the kernel's: each record is an 8-byte header (u32 length with
the BUSY and DISCARD bits, u32 page offset) followed by the sample, padded to 8 bytes;
the producer position is read before the headers, the consumer position written after
the batch.
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
# the most a batch maps at once (its records are copied out, then it is unmapped): a
# full 64 MiB ring read after a burst adds this much to the RSS, not its size
WINDOW = 4 << 20


def fdinfo_field(fd: int, key: str) -> int | None:
    """The integer field `key` of the BPF object behind `fd` in /proc/self/fdinfo
    (`max_entries`, `map_id`, ...); None when it cannot be read."""
    try:
        with open(f"/proc/self/fdinfo/{fd}") as f:
            for line in f:
                if line.startswith(f"{key}:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def max_entries(fd: int) -> int:
    """The data area's size of the map behind `fd` (its `max_entries`)."""
    if (n := fdinfo_field(fd, "max_entries")) is None:
        raise GputraceError(f"cannot read the size of the ring buffer map (fd {fd})")
    return n


class RingReader:
    """One ring buffer map `fd`; `consume()` hands each committed record's bytes to
    `on_record` in order and frees their space. One thread consumes a reader."""

    def __init__(self, fd: int, on_record: Callable[[bytes], object]) -> None:
        self.fd = fd
        self.on_record = on_record
        page = self._page = mmap.PAGESIZE
        size = max_entries(fd)
        if size < page or size & (size - 1):
            raise GputraceError(f"ring buffer map (fd {fd}): odd size {size}")
        self.size, self._mask = size, size - 1
        try:
            self._cons_map = mmap.mmap(fd, page, mmap.MAP_SHARED,
                                       mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
            self._prod_map = mmap.mmap(fd, page, mmap.MAP_SHARED, mmap.PROT_READ,
                                       offset=page)
        except OSError as e:
            raise GputraceError(f"cannot map the ring buffer (fd {fd}): {e}") from None
        # aligned 8-byte loads and stores through ctypes are single instructions: on
        # x86-64 a load is an acquire and a store a release, as the protocol needs
        self._cons = ctypes.c_uint64.from_buffer(self._cons_map)
        self._poll: select.epoll | None = None

    def producer_pos(self) -> int:
        return int(_U64.unpack_from(self._prod_map, 0)[0])

    def available(self) -> int:
        """Bytes committed or reserved and not yet consumed."""
        return self.producer_pos() - int(self._cons.value)

    def consume(self) -> int:
        """Hand every committed record on, in order; returns how many were handed on.
        Stops at the first record still being written (BUSY): the next call takes it."""
        n = 0
        while True:
            cons = int(self._cons.value)
            prod = self.producer_pos()
            if cons >= prod:
                return n
            got, cons_after, busy = self._batch(cons, prod)
            n += got
            if cons_after != cons:
                self._cons.value = cons_after  # after the batch: the space is free now
            if busy:
                return n

    def _batch(self, cons: int, prod: int) -> tuple[int, int, bool]:
        """The records from `cons` on, through a mapping of at most WINDOW bytes of
        their pages (more for one record longer than that): (records handed on, the
        position after them, whether a record still being written stopped it)."""
        page, cb, unpack = self._page, self.on_record, _U32.unpack_from
        first = (cons & self._mask) & ~(page - 1)
        skew = (cons & self._mask) - first
        span = min(prod - cons, WINDOW)
        while True:
            length = (skew + span + page - 1) & ~(page - 1)  # <= size + page
            try:  # data at 2 pages: offsets up to twice the size are the kernel's 2nd map
                window = mmap.mmap(self.fd, length, mmap.MAP_SHARED, mmap.PROT_READ,
                                   offset=2 * page + first)
            except OSError as e:
                raise GputraceError(f"cannot map the ring buffer (fd {self.fd}): {e}") from None
            view = memoryview(window)
            n, at, end, busy = 0, skew, skew + span, False
            try:
                while at < end:  # a header is 8 bytes at an 8-aligned offset: mapped
                    (hdr,) = unpack(view, at)
                    if hdr & BUSY_BIT:
                        busy = True
                        break
                    size = hdr & _LEN_MASK
                    stop = at + HEADER + size
                    if stop > length:
                        break  # past the window: the next batch starts with it
                    if not hdr & DISCARD_BIT:
                        cb(bytes(view[at + HEADER : stop]))
                        n += 1
                    at += (size + HEADER + 7) & ~7
            finally:
                view.release()
                window.close()
            if at > skew or busy:
                return n, cons + at - skew, busy
            span = min(prod - cons, ((size + HEADER + 7) & ~7))  # one longer record

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
        self._prod_map.close()
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
