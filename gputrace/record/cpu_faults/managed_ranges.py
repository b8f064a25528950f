"""CPU page faults on managed memory: the user-space side of
probes/nv_faults.bpf.h.

The probe keeps each traced process's managed ranges (mmaps of nvidia-uvm with
offset == address) as a bitmap of 4 KiB pages per 2 MiB block and records the
`exceptions:page_fault_user` faults that fall inside them. This module seeds
the ranges of processes that mapped them before recording began (from
/proc/PID/maps), decodes the fault batches into the `faults` table, and says
which layer the faults stand for.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gputrace.record import decode
from gputrace.record.cpu_faults import decode as decode_faults

HOOK = "exceptions:page_fault_user"
LAYER = "cpu_faults"
"""Manifest layer of these faults: a kernel tracepoint, not driver internals
(the `driver` layer stays for the nvidia-uvm kprobes of GPU faults)."""
PAGE = 4096
BLOCK = 2 << 20
PAGES_PER_BLOCK = BLOCK // PAGE
SMALL_BLOCKS = 512  # GT_SMALL_BLOCKS: longer ranges are kept whole (GT_BIG_RANGES slots)

Blocks = dict[int, list[int]]  # block number (address >> 21) -> 8 words of page bits


def layers(attached: Iterable[Any]) -> list[str]:
    """[LAYER] when the page-fault hook is attached, else []."""
    return [LAYER] if any(getattr(h, "name", h) == HOOK for h in attached) else []


def managed_ranges(pid: int, prefix: str) -> list[tuple[int, int]]:
    """[(start, end)] of the managed mappings in /proc/PID/maps: the device dir's
    nvidia-uvm mapped at an offset equal to the address."""
    uvm = prefix.rstrip("/") + "/nvidia-uvm"
    out = []
    try:
        text = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return []
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or parts[5] != uvm:
            continue
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        if int(parts[2], 16) == lo:
            out.append((lo, hi))
    return out


def blocks_of(ranges: Iterable[tuple[int, int]]) -> Blocks:
    """Page bitmaps per 2 MiB block, as the probe keeps them (struct mblock)."""
    out: Blocks = {}
    for lo, hi in ranges:
        first, end = lo // PAGE, (hi + PAGE - 1) // PAGE  # pages [first, end)
        for block in range(first // PAGES_PER_BLOCK, (end - 1) // PAGES_PER_BLOCK + 1):
            a = max(first, block * PAGES_PER_BLOCK) - block * PAGES_PER_BLOCK
            b = min(end, (block + 1) * PAGES_PER_BLOCK) - block * PAGES_PER_BLOCK
            mask = ((1 << b) - 1) & ~((1 << a) - 1)
            words = out.setdefault(block, [0] * 8)
            for w in range(8):
                words[w] |= (mask >> (64 * w)) & 0xFFFFFFFFFFFFFFFF
    return out


def is_big(lo: int, hi: int) -> bool:
    """Kept whole, as the probe does for ranges of more than SMALL_BLOCKS blocks."""
    return (hi - 1) // BLOCK - lo // BLOCK + 1 > SMALL_BLOCKS


def seed(pids: Iterable[int], prefix: str) -> dict[int, tuple[Blocks, list[tuple[int, int]]]]:
    """Managed ranges of already running processes, for `Probes.seed_managed`:
    {pid: (page bitmaps of the small ranges, [(start, end)] of the big ones)}."""
    out = {}
    for pid in pids:
        ranges = managed_ranges(pid, prefix)
        if ranges:
            big = [r for r in ranges if is_big(*r)]
            out[pid] = (blocks_of(r for r in ranges if not is_big(*r)), big)
    return out


def decode_batch(kind: str, data: bytes) -> tuple[Any, int]:
    """Fault batch bodies (`fault_events`) or whole leftover batches
    (`fault_leftover`) as a `faults` batch (None when empty), and the number of
    records skipped as unreadable."""
    dtype = decode_faults.FAULT_DTYPE
    ev, bad = (decode.records(data, dtype) if kind == "fault_events"
               else decode.batched(data, dtype, decode_faults.FAULT_STAGE_EVENTS))  # fmt: skip
    return (decode_faults.faults_batch(ev) if len(ev) else None), bad
