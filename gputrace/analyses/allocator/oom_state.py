"""What did PyTorch's caching allocator hold on the failing device when it ran out of
memory?

For each `oom` trace entry, the state just before it on its device, from the replay
(allocator/replay.py: the snapshot's state, the entries after the failure undone):
reserved, active (rounded) and requested bytes, the cache's free bytes (reserved minus
active) and its largest free block, and what the allocator released just before
(the `segment_free`/`segment_unmap` entries between the last allocation and the
failure: PyTorch frees its cached segments, as `empty_cache` does, before it gives
up). The verdict is `oom_rules.judge` with CUDA's free bytes from the entry and the
cache's free bytes as the allocator pool.

The largest free block is found block by block: the snapshot's segments (and mapped
ranges of expandable segments) and its live blocks, rolled back entry by entry (an
`alloc` after the failure was not there yet; a block freed after it still was, at its
request rounded up to 512 bytes). A snapshot without history taken at the failure (an
out-of-memory observer's dump) holds no `oom` entry: its end state, which
allocator-pool reports per device and pool, is the allocator at the failure.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from typing import Any

import polars as pl

from gputrace import oom_rules
from gputrace.analyses.allocator.replay import MIN_BLOCK, entries
from gputrace.analyses.helpers.inputs import Inputs

_RELEASE = ("segment_free", "segment_unmap")


class CacheMemory:
    """One device's segments (pieces of mapped address space) and live blocks (address:
    bytes), as the replay rolls them back."""

    def __init__(self, pieces: list[tuple[int, int, bool]], blocks: dict[int, int]) -> None:
        self.pieces = {s: (e, x) for s, e, x in pieces}
        self.blocks = blocks

    def add_piece(self, start: int, size: int, expandable: bool) -> None:
        self.pieces[start] = (start + size, expandable)

    def remove_range(self, start: int, size: int) -> None:
        """Take [start, start+size) out of whichever pieces hold it."""
        end = start + size
        for s, (e, x) in list(self.pieces.items()):
            if e <= start or s >= end:
                continue
            del self.pieces[s]
            if s < start:
                self.pieces[s] = (start, x)
            if e > end:
                self.pieces[end] = (e, x)

    def runs(self) -> list[tuple[int, int, list[tuple[int, int]]]]:
        """The mapped ranges as the allocator can use them, in address order (each
        segment; the adjacent mapped pieces of an expandable segment joined), each with
        its live blocks (address, bytes) in address order."""
        runs: list[tuple[int, int]] = []
        for s in sorted(self.pieces):
            e, x = self.pieces[s]
            if runs and x and runs[-1][1] == s and self._expandable_end(runs[-1][1]):
                runs[-1] = (runs[-1][0], e)
            else:
                runs.append((s, e))
        addrs = sorted(self.blocks)
        out = []
        for s, e in runs:
            k, inside = bisect_left(addrs, s), []
            while k < len(addrs) and addrs[k] < e:
                inside.append((addrs[k], self.blocks[addrs[k]]))
                k += 1
            out.append((s, e, inside))
        return out

    def largest_free(self) -> int:
        """The largest run of mapped bytes in one segment holding no live block
        (adjacent pieces of expandable segments join; whole segments never do)."""
        best = 0
        for s, e, inside in self.runs():
            cur = s
            for a, size in inside:
                best = max(best, a - cur)
                cur = max(cur, a + size)
            best = max(best, e - cur)
        return best

    def _expandable_end(self, at: int) -> bool:
        return any(e == at and x for e, x in self.pieces.values())


def _rollback(mem: CacheMemory, e: dict[str, Any]) -> None:
    """Undo one entry (walking backwards from the snapshot)."""
    a, addr, size = e["action"], e["address"], int(e["size"] or 0)
    if addr is None:
        return
    if a == "alloc":
        mem.blocks.pop(addr, None)
    elif a == "free_completed":
        mem.blocks[addr] = max(MIN_BLOCK, -(-size // MIN_BLOCK) * MIN_BLOCK)
    elif a in ("segment_alloc", "segment_map"):
        mem.remove_range(addr, size)
    elif a == "segment_free":
        mem.add_piece(addr, size, False)
    elif a == "segment_unmap":
        mem.add_piece(addr, size, True)


def _end_memory(inp: Inputs, device: int) -> CacheMemory:
    segs = (inp.scan("allocator_segments").filter(pl.col("device") == device)
            .select("address", "total_size_bytes", "is_expandable").collect())
    blocks = (inp.scan("allocator_blocks")
              .filter((pl.col("device") == device) & (pl.col("state") != "inactive"))
              .select("address", "size_bytes").collect())
    return CacheMemory([(int(a), int(a) + int(t), bool(x)) for a, t, x in segs.iter_rows()],
                   {int(a): int(s) for a, s in blocks.iter_rows()})


def _released(dev: pl.DataFrame, i: int) -> dict[str, int]:
    """The releases between the last allocation before entry `i` and it."""
    before = dev.filter(pl.col("i") < i)
    last_alloc = before.filter(pl.col("action").is_in(["alloc", "segment_alloc",
                                                        "segment_map"]))["i"].max()
    run = before.filter(pl.col("i") > (last_alloc if last_alloc is not None else -1))
    rel = run.filter(pl.col("action").is_in(_RELEASE))
    return {"segment_frees": int((rel["action"] == "segment_free").sum()),
            "segment_unmaps": int((rel["action"] == "segment_unmap").sum()),
            "bytes": int(rel["size"].sum())}


def memory_at_ooms(inp: Inputs, rep: pl.DataFrame
                   ) -> Iterator[tuple[dict[str, Any], pl.DataFrame, CacheMemory]]:
    """Per `oom` entry of the replay `rep` (allocator/replay.py `entries`, collected),
    device by device, latest first: its row, its device's rows, and the memory just
    before it (the snapshot's, the later entries rolled back). The memory is rolled on
    for the next entry: read it before asking for the next."""
    for (device,), dev in rep.group_by(["device"], maintain_order=True):
        ooms = dev.filter(pl.col("action") == "oom")
        if not ooms.height:
            continue
        mem = _end_memory(inp, int(device))
        later = dev.filter(pl.col("i") > ooms["i"].min()).sort("i", descending=True)
        todo = sorted(ooms.iter_rows(named=True), key=lambda r: -r["i"])
        rows = later.select("i", "action", "address", "size").iter_rows(named=True)
        pending = next(rows, None)
        for o in todo:
            while pending is not None and pending["i"] > o["i"]:
                _rollback(mem, pending)
                pending = next(rows, None)
            yield o, dev, mem


def has_oom(inp: Inputs) -> bool:
    """Whether the snapshot's history holds an `oom` entry (the replay is not built
    for nothing)."""
    if not inp.has("allocator"):
        return False
    n = (inp.scan("allocator_events").filter(pl.col("action") == "oom").select(pl.len())
         .collect().item())
    return bool(n)


def oom_states(inp: Inputs) -> list[dict[str, Any]]:
    """Per `oom` entry (device, then history order): the allocator at the failure."""
    if not has_oom(inp):
        return []
    out = [_state(o, mem.largest_free(), _released(dev, o["i"]))
           for o, dev, mem in memory_at_ooms(inp, entries(inp).collect())]
    return sorted(out, key=lambda r: (r["device"], r["seq"]))


def _state(o: dict[str, Any], largest: int, released: dict[str, int]) -> dict[str, Any]:
    free = o["device_free_bytes"]
    requested = int(o["size"]) if o["size"] else None
    v = oom_rules.judge(requested, free, None, o["cache_free_bytes"])
    if v.name == "unknown" and free is not None:  # free >= requested: the cache's shape
        v = oom_rules.Verdict(
            "fragmentation" if requested and largest < requested else "limit",
            f"requested {_b(requested)} <= CUDA free {_b(free)} + cache free "
            f"{_b(o['cache_free_bytes'])}; largest free block in the cache {_b(largest)}")
    evidence = (f"{v.evidence}; the allocator held {_b(o['reserved_bytes'])} reserved, "
                f"{_b(o['active_bytes'])} in blocks ({_b(o['requested_bytes'])} requested), "
                f"{_b(o['cache_free_bytes'])} free in its cache, largest free block "
                f"{_b(largest)}")
    if released["bytes"]:
        evidence += (f"; it had just released {_b(released['bytes'])} "
                     f"({released['segment_frees']} segment frees, "
                     f"{released['segment_unmaps']} unmaps)")
    return {
        "device": o["device"], "seq": o["seq"], "ts_ns": o["ts_ns"], "pid": o["pid"],
        "stream": o["stream"], "stack_id": o["stack_id"], "requested_bytes": requested,
        "device_free_bytes": free, "reserved_bytes": o["reserved_bytes"],
        "active_bytes": o["active_bytes"], "requested_active_bytes": o["requested_bytes"],
        "cache_free_bytes": o["cache_free_bytes"], "largest_free_block_bytes": largest,
        "pool_id": o["pool_id"], "released_before": released,
        "verdict": v.name, "evidence": evidence,
    }


def _b(n: int | None) -> str:
    from gputrace.units import format_bytes

    return "?" if n is None else format_bytes(n)
