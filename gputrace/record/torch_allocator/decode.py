"""The torch_allocator layer's events (struct torch_event, probes/torch_events.h) as
rows of the allocator tables the snapshot importer writes, and the caching allocator's
state kept from them (writer thread).

Each tensor: `alloc` (its pointer, requested size, device, stream, stack) when malloc
returns; `free_requested` when free is called, then `free_completed` at the same
instant, or, when that free deferred the block (another stream used it: `defer`, the
free's insert_events), when the block goes back to the cache (`release`, its
free_block). Which of the two is known at the thread's next event: the free's
`free_completed` is written then (or at the end). Segments: `segment_alloc` for a
cuMemAlloc_v2 made inside malloc, `segment_free` for a cuMemFree_v2 of one of those
addresses; an expandable segment's pages `segment_map` for a cuMemMap made inside
malloc, `segment_unmap` for a cuMemUnmap of one of those pages. `oom`: a malloc whose
segment call failed out of memory and that never returned.

The cudaMallocAsync backend (mallocAsync/freeAsync): `alloc` of the size asked (the
driver's pool rounds, not PyTorch), `free_requested` at freeAsync, `free_completed` at
the cuMemFreeAsync of that pointer: at once, or later for a free PyTorch defers (a
tensor made outside a CUDA graph capture and freed during one).

The state at the end (allocator_segments, allocator_blocks) is what these rows leave
alive: each live tensor an `active_allocated` block of its requested size rounded up
to 512 bytes (PyTorch's kMinBlockSize rounding), the gaps between them in a segment
`inactive` blocks (cached). An expandable segment is, as in PyTorch's snapshot, each
run of contiguous mapped pages (`is_expandable`). Each async tensor alive, or freed
and not yet given back (`active_pending_free`), is a segment of its own in pool
`async` (that backend has no segments; the driver's pool is not PyTorch's to count).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from gputrace import schema
from gputrace.record import decode
from gputrace.record.structs import mirror

TORCH_DTYPE = mirror("torch_events.h", "torch_event", np.dtype([
    ("ts_ns", "<u8"), ("latency_ns", "<u8"), ("ptr", "<u8"), ("size_bytes", "<u8"),
    ("stream", "<u8"), ("request_bytes", "<u8"), ("pid", "<u4"), ("tid", "<u4"),
    ("stack_id", "<i4"), ("py_stack_id", "<i4"), ("result", "<i4"), ("device", "<i2"),
    ("kind", "u1"), ("_pad", "u1"),
]))  # fmt: skip
"""Mirror of struct torch_event (tests/unit/record/test_event_structs.py compiles both)."""

KINDS = {0: "alloc", 1: "free", 2: "seg_alloc", 3: "seg_free", 4: "oom", 5: "seg_fail",
         6: "seg_map", 7: "seg_unmap", 8: "release", 9: "defer"}
"""GT_TORCH_* of torch_events.h, by their C names."""
MIN_BLOCK = 512
SMALL_SIZE = 1 << 20  # requests up to 1 MiB come from the small pool


def rounded(size: int) -> int:
    """A block's size for a request (PyTorch's round_size without roundup options)."""
    return max(MIN_BLOCK, -(-size // MIN_BLOCK) * MIN_BLOCK)


@dataclass
class Tensor:
    size: int
    device: int
    stream: int
    stack_id: int | None
    backend: int = 0  # 0 native, 1 cudaMallocAsync

    @property
    def block(self) -> int:
        """Its block's size: rounded by the native allocator, as asked by the async one."""
        return self.size if self.backend else rounded(self.size)


@dataclass
class Segment:
    size: int
    device: int
    stream: int
    pool: str
    ts_ns: int


@dataclass
class AllocatorState:
    """Live segments and tensors per process, and each device's entry count."""

    segments: dict[tuple[int, int], Segment] = field(default_factory=dict)
    pages: dict[tuple[int, int], Segment] = field(default_factory=dict)  # expandable
    tensors: dict[tuple[int, int], Tensor] = field(default_factory=dict)
    pending: dict[tuple[int, int], Tensor] = field(default_factory=dict)  # freed, held
    # (pid, tid) -> the native free just made (ts, ptr, tensor): completed at once
    # unless that thread's next event defers it
    undecided: dict[tuple[int, int], tuple[int, int, Tensor]] = field(default_factory=dict)
    seq: dict[tuple[int, int], int] = field(default_factory=dict)
    # (pid, tid) -> the malloc whose segment call failed out of memory: an oom unless
    # that thread's malloc still returns (its retry after freeing the cache worked)
    failing: dict[tuple[int, int], tuple[int, int, int, int, int]] = field(
        default_factory=dict)
    realtime_offset_ns: int = 0

    def forget(self, pids: set[int]) -> None:
        """Processes gone: their state is what their exit left (written already)."""
        for d in (self.segments, self.pages, self.tensors, self.pending, self.seq):
            for k in [k for k in d if k[0] in pids]:
                del d[k]

    def rows(self, ev: np.ndarray[Any, Any], stack_of: dict[tuple[int, int], int]
             ) -> pa.Table | None:
        """allocator_events rows of `ev`, in order; the state follows them.
        `stack_of`: (pid, stack key) -> allocator stack id."""
        cols: dict[str, list[Any]] = {c.name: [] for c in schema.ALLOCATOR_EVENTS.columns}
        keys = decode_keys(ev)
        for e, key in zip(ev.tolist(), keys.tolist(), strict=True):
            ts, _lat, ptr, size, stream, request, pid, tid, _s, _p, result, device, kind, _ = e
            sid = stack_of.get((pid, key)) if key >= 0 else None
            u = self.undecided.pop((pid, tid), None)
            if u is not None:
                if kind == 9 and ptr == u[1]:  # deferred: completed at its release
                    self.pending[(pid, ptr)] = u[2]
                    continue
                self._completed(cols, pid, *u)
            if kind == 5:
                self.failing[(pid, tid)] = (ts, device, size, stream, sid or 0)
                continue
            if kind in (0, 4):  # that malloc returned, or its oom is known
                self.failing.pop((pid, tid), None)
            if kind == 1:  # free: both entries, of the tensor's size and device
                t = self.tensors.pop((pid, ptr), None)
                if t is None:
                    continue  # allocated before the recording: nothing known of it
                self._add(cols, ts, pid, t.device, "free_requested", ptr, t.block, t.stream,
                          t.stack_id)
                if t.backend:  # given back at its cuMemFreeAsync (kind 8)
                    self.pending[(pid, ptr)] = t
                else:
                    self.undecided[(pid, tid)] = (ts, ptr, t)
            elif kind == 8:
                t = self.pending.pop((pid, ptr), None)
                if t is not None:
                    self._completed(cols, pid, ts, ptr, t)
            elif kind == 0:
                t = self.tensors[(pid, ptr)] = Tensor(size, device, stream, sid, min(result, 1))
                self._add(cols, ts, pid, device, "alloc", ptr, t.block, stream, sid)
            elif kind in (2, 6):  # a segment, an expandable segment's page
                pool = "small" if request <= SMALL_SIZE else "large"
                into = self.segments if kind == 2 else self.pages
                into[(pid, ptr)] = Segment(size, device, stream, pool, ts)
                self._add(cols, ts, pid, device, "segment_alloc" if kind == 2 else "segment_map",
                          ptr, size, stream, None)
            elif kind in (3, 7):
                seg = (self.segments if kind == 3 else self.pages).pop((pid, ptr), None)
                if seg is None:
                    continue  # not one of the allocator's segments
                self._add(cols, ts, pid, seg.device,
                          "segment_free" if kind == 3 else "segment_unmap", ptr, seg.size,
                          seg.stream, None)
            elif kind == 4:
                self._add(cols, ts, pid, device, "oom", None, size, stream, sid)
        return _table(cols)

    def unsettled(self) -> pa.Table | None:
        """The end of the recording: the last free of each thread is completed (no
        deferral followed it); mallocs whose segment call failed and that never
        returned are out-of-memory failures (their threads made no call since)."""
        cols: dict[str, list[Any]] = {c.name: [] for c in schema.ALLOCATOR_EVENTS.columns}
        for (pid, _tid), u in sorted(self.undecided.items(), key=lambda x: x[1][0]):
            self._completed(cols, pid, *u)  # no event of its thread after the free
        self.undecided.clear()
        for (pid, _tid), (ts, device, size, stream, sid) in sorted(self.failing.items()):
            self._add(cols, ts, pid, device, "oom", None, size, stream, sid or None)
        self.failing.clear()
        return _table(cols)

    def _completed(self, cols: dict[str, list[Any]], pid: int, ts: int, ptr: int,
                   t: Tensor) -> None:
        self._add(cols, ts, pid, t.device, "free_completed", ptr, t.block, t.stream, t.stack_id)

    def _add(self, cols: dict[str, list[Any]], ts: int, pid: int, device: int, action: str,
             address: int | None, size: int, stream: int, stack_id: int | None) -> None:
        n = self.seq.get((pid, device), 0)
        self.seq[(pid, device)] = n + 1
        row = {"ts_ns": ts, "time_us": (ts + self.realtime_offset_ns) // 1000, "seq": n,
               "pid": pid, "device": device, "action_code": ACTION_CODES[action],
               "action": action, "address": address, "size_bytes": size,
               "device_free_bytes": None, "stream": stream, "stack_id": stack_id,
               "compile_context": None, "user_metadata": None}
        for k, v in row.items():
            cols[k].append(v)

    def state_tables(self) -> dict[str, pa.Table]:
        """allocator_segments and allocator_blocks as the rows so far leave them."""
        segs: dict[str, list[Any]] = {c.name: [] for c in schema.ALLOCATOR_SEGMENTS.columns}
        blocks: dict[str, list[Any]] = {c.name: [] for c in schema.ALLOCATOR_BLOCKS.columns}
        held = {**{k: (s, False) for k, s in self.segments.items()}, **_runs(self.pages)}
        inside: dict[tuple[int, int], list[tuple[int, Tensor]]] = {}
        starts = sorted(held)
        states: dict[tuple[int, int], int] = {}
        for state, tensors in ((1, self.tensors), (2, self.pending)):
            for (pid, ptr), t in tensors.items():
                seg = _holder(starts, held, pid, ptr) if not t.backend else None
                if seg is not None:
                    inside.setdefault(seg, []).append((ptr, t))
                    states[(pid, ptr)] = state
        for (pid, addr) in starts:
            s, expandable = held[(pid, addr)]
            live = sorted(inside.get((pid, addr), []), key=lambda x: x[0])
            active = sum(t.block for _, t in live)
            allocated = sum(t.block for p, t in live if states[(pid, p)] == 1)
            _segment(segs, pid, addr, s, allocated, active, sum(t.size for _, t in live),
                     expandable)
            at = addr
            ends: list[tuple[int, Tensor | None]] = [*live, (addr + s.size, None)]
            for ptr, blk in ends:
                if ptr > at:  # cached space between live blocks
                    _block(blocks, pid, s.device, addr, at, ptr - at, 0, 0, None)
                if blk is None:
                    break
                _block(blocks, pid, s.device, addr, ptr, blk.block, blk.size,
                       states[(pid, ptr)], blk.stack_id)
                at = ptr + blk.block
        # the async backend's tensors: each its own segment (alive, or pending free)
        for state, tensors in ((1, self.tensors), (2, self.pending)):
            for (pid, ptr), t in sorted(tensors.items()):
                if t.backend:
                    own = Segment(t.size, t.device, t.stream, "async", 0)
                    _segment(segs, pid, ptr, own, t.size if state == 1 else 0, t.size, t.size,
                             False)
                    _block(blocks, pid, t.device, ptr, ptr, t.size, t.size, state, t.stack_id)
        return {"allocator_segments": pa.Table.from_pydict(
                    segs, schema=schema.ALLOCATOR_SEGMENTS.arrow_schema),
                "allocator_blocks": pa.Table.from_pydict(
                    blocks, schema=schema.ALLOCATOR_BLOCKS.arrow_schema)}  # fmt: skip


def _segment(cols: dict[str, list[Any]], pid: int, addr: int, s: Segment, allocated: int,
             active: int, requested: int, expandable: bool) -> None:
    for k, v in {"pid": pid, "device": s.device, "address": addr,
                 "total_size_bytes": s.size, "allocated_size_bytes": allocated,
                 "active_size_bytes": active, "requested_size_bytes": requested,
                 "stream": s.stream, "pool": s.pool, "pool_id": "0,0",
                 "is_expandable": expandable, "stack_id": None,
                 "api_alloc_ts_ns": s.ts_ns if s.pool != "async" and not expandable
                 else None}.items():
        cols[k].append(v)


def _runs(pages: dict[tuple[int, int], Segment]) -> dict[tuple[int, int], tuple[Segment, bool]]:
    """An expandable segment's mapped pages as PyTorch's snapshot reports them: one
    segment per run of contiguous pages (of one device, stream and pool)."""
    out: dict[tuple[int, int], tuple[Segment, bool]] = {}
    run: tuple[int, int] | None = None
    for (pid, addr) in sorted(pages):
        p = pages[(pid, addr)]
        if run is not None:
            r = out[run][0]
            if run[0] == pid and run[1] + r.size == addr and \
                    (r.device, r.stream, r.pool) == (p.device, p.stream, p.pool):
                r.size += p.size
                continue
        run = (pid, addr)
        out[run] = (Segment(p.size, p.device, p.stream, p.pool, p.ts_ns), True)
    return out


ACTION_CODES = {v: k for k, v in schema.ALLOCATOR_ACTIONS.items()}


def _table(cols: dict[str, list[Any]]) -> pa.Table | None:
    if not cols["ts_ns"]:
        return None
    return pa.Table.from_pydict(cols, schema=schema.ALLOCATOR_EVENTS.arrow_schema)
_STATES = schema.BLOCK_STATES


def decode_keys(ev: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Each event's stack key (python_stacks.stack_keys of its two ids)."""
    from gputrace.record import python_stacks

    return python_stacks.stack_keys(ev["stack_id"], ev["py_stack_id"])


def _holder(starts: list[tuple[int, int]],
            segments: dict[tuple[int, int], tuple[Segment, bool]],
            pid: int, ptr: int) -> tuple[int, int] | None:
    """The segment of `pid` that holds address `ptr`."""
    import bisect

    i = bisect.bisect_right(starts, (pid, ptr)) - 1
    if i >= 0 and starts[i][0] == pid:
        addr = starts[i][1]
        if ptr < addr + segments[starts[i]][0].size:
            return starts[i]
    return None


def _block(cols: dict[str, list[Any]], pid: int, device: int, seg: int, addr: int, size: int,
           requested: int, state: int, stack_id: int | None) -> None:
    for k, v in {"pid": pid, "device": device, "segment_address": seg, "address": addr,
                 "size_bytes": size, "requested_size_bytes": requested, "state_code": state,
                 "state": _STATES[state], "stack_id": stack_id}.items():
        cols[k].append(v)


def records(data: bytes) -> tuple[np.ndarray[Any, Any], int]:
    """The whole torch_event records in `data`, and those skipped (cut short, unknown kind)."""
    ev, bad = decode.records(data, TORCH_DTYPE)
    ev, unknown = decode.known(ev, {"kind": KINDS})
    return ev, bad + unknown
