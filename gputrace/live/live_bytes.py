"""Live bytes per process, as a recording appends its tables: each allocation paired
with what ends it, and the memory a process holds, each piece told once.

- `api`: cuda_calls allocations paired with their frees by (pid, pointer or handle), as
  the offline lifetimes pair them (gputrace.analyses.helpers.lifetimes); failed calls
  never count; address reservations are not memory.
- `rm`: RM_ALLOC / RM_ALLOC_MEMORY of the memory classes and RM_VID_HEAP_CONTROL
  allocations (not the virtual ones), ended by their own RM_FREE, the RM_FREE of their
  parent or of their client (gputrace.analyses.helpers.rm_objects; fd releases are not
  followed live). The GPU is that of the RM device (class 0x80) the object hangs under.
- `uvm`: managed mmaps of the UVM fd (ended by a munmap at their address) and
  UVM_MAP_EXTERNAL_ALLOCATION mappings (ended by UVM_FREE or UVM_UNMAP_EXTERNAL of their
  base, or by the UVM_FREE of the external range holding them), as
  gputrace.analyses.helpers.uvm_ranges pairs them.

The layers see the same memory (an API allocation lies in an RM object that UVM maps),
so they are never added: `held(pids)` runs the offline join rules
(gputrace.analyses.allocations.join.link) over the allocations alive now and sizes
each piece by one layer (held.of_size_layer), host memory left out: the one figure
every "who holds what" view shows. The per-layer live bytes (`Proc.live`) are a
breakdown beside it.

A process's memory ends with it: `forget(pid)` when its exit is seen.
"""

from __future__ import annotations

import functools
import re
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import polars as pl
import pyarrow as pa

from gputrace.analyses.allocations.held import is_host_memory, of_size_layer
from gputrace.analyses.allocations.join import link
from gputrace.analyses.helpers.lifetimes import API_ALLOCS, API_FREES, API_SUFFIX, COLUMNS
from gputrace.analyses.helpers.rm_objects import ALLOCS, LABELS, VID_HEAP
from gputrace.analyses.helpers.uvm_ranges import EXTERNAL as _EXTERNAL
from gputrace.analyses.helpers.uvm_ranges import MANAGED as _MANAGED
from gputrace.analyses.helpers.uvm_ranges import UVM_CLOSES, UVM_MAP, UVM_RESERVE
from gputrace.nvabi import MEMORY_CLASSES, NVOS32_ALLOC_FLAGS_VIRTUAL
from gputrace.nvabi import NV01_DEVICE_0 as DEVICE_CLASS
from gputrace.nvabi import NV20_SUBDEVICE_0 as SUBDEVICE_CLASS

COUNTED_LAYERS = ("api", "rm", "uvm")  # the `layer` values live bytes are counted for
UVM_NAMES = (UVM_RESERVE, UVM_MAP, *UVM_CLOSES)
"""ioctls that make or end UVM mappings and the ranges holding them."""
_API_KIND = {**{f: ("alloc", k) for f, k in API_ALLOCS.items()},
             **{f: ("free", k) for f, k in API_FREES.items()}}
_MMAP, _MUNMAP = 1, 2  # mappings.op_code


_SUFFIX = re.compile(API_SUFFIX)


@functools.lru_cache(maxsize=256)
def _base(func: str) -> str:
    """cuMemAlloc_v2, cuMemFreeAsync_ptsz -> cuMemAlloc, cuMemFreeAsync: the offline
    lifetimes' rule (API_SUFFIX), per name once."""
    return _SUFFIX.sub("", func, count=1)


class Item(NamedTuple):
    """One live allocation, with the evidence the join rules read."""

    size: int
    gpu: int | None
    ts: int  # allocation time
    end: int  # the call's return (its entry when unknown)
    tid: int | None
    what: str
    ident: int  # pointer, handle or base address
    client: int | None = None
    handle: int | None = None


@dataclass
class Allocations:
    """One process's live allocations per layer."""

    api: dict[tuple[bool, int], Item] = field(default_factory=dict)  # (is handle, id)
    rm: dict[tuple[int, int], Item] = field(default_factory=dict)  # (client, handle)
    rm_parent: dict[tuple[int, int], int] = field(default_factory=dict)
    rm_gpu: dict[tuple[int, int], int | None] = field(default_factory=dict)  # devices
    rm_kids: dict[tuple[int, int], set[int]] = field(default_factory=dict)  # (client, parent)
    # (what, base): a managed mmap and an external mapping may take the same address at
    # different times, and the tables that make and end them arrive in any order
    uvm: dict[tuple[str, int], Item] = field(default_factory=dict)
    ranges: dict[int, int] = field(default_factory=dict)  # external range base -> length


@dataclass
class Proc:
    """One process's running totals."""

    pid: int
    comm: str = ""
    first_ns: int = 0
    who: tuple[str, str, str] = ("", "", "")  # (namespace, pod, container): Identity.labels
    live: Counter[tuple[str, int | None]] = field(default_factory=Counter)  # (layer, gpu)
    held_bytes: int = 0
    """The process's one figure: its pieces of GPU memory, each sized by one layer
    (`LiveBytes.held`); `live` is the per-layer breakdown, never added across layers."""
    stale: bool = False  # `live` changed since `held_bytes` was computed
    allocations: Counter[str] = field(default_factory=Counter)  # per layer
    frees: Counter[str] = field(default_factory=Counter)
    gpu_faults: int = 0
    cpu_faults: int = 0
    migrations: int = 0
    # (ts_ns, held bytes) at each change, pruned to the growth window (plus one before it)
    history: deque[tuple[int, int]] = field(default_factory=deque)
    # (ts_ns, allocations, frees, gpu faults, migrations) samples for the event rates
    samples: deque[tuple[int, int, int, int, int]] = field(default_factory=deque)

    def add_live(self, layer: str, gpu: int | None, delta: int) -> None:
        """Live bytes of (layer, gpu) change by `delta`; a series at zero goes away."""
        key = (layer, gpu)
        self.live[key] += delta
        if self.live[key] <= 0:
            del self.live[key]
        self.stale = True


class LiveBytes:
    """The allocations alive now, per process: API pointers and handles, RM memory
    objects (with the GPU of their device and the objects under each parent), UVM
    mappings."""

    def __init__(self, procs: dict[int, Proc],
                 proc: Callable[[int, str | None, int], Proc]) -> None:
        self._procs = procs  # looked up (never created) when a free ends an object
        self._proc = proc  # the process's totals, created at first sight
        self._of: dict[int, Allocations] = {}

    def _allocs(self, pid: int) -> Allocations:
        a = self._of.get(pid)
        if a is None:
            a = self._of[pid] = Allocations()
        return a

    def forget(self, pid: int) -> None:
        """The process exited: its allocations go with it."""
        self._of.pop(pid, None)

    # ------------------------------------------------------------ rm
    def rm_row(self, r: dict[str, Any], now: int) -> None:
        """One RM alloc or free row of `ioctls` (succeeded ones count)."""
        if (r["ret"] or 0) != 0 or (r["status"] or 0) != 0:
            return
        pid, client, handle = r["pid"], r["h_client"], r["h_object"]
        if client is None or handle is None:
            return
        name, cls, size = r["name"], r["h_class"], r["size_bytes"] or 0
        if name in ALLOCS and cls in (DEVICE_CLASS, SUBDEVICE_CLASS):
            a = self._allocs(pid)
            gpu = r["gpu_index"] if cls == DEVICE_CLASS else a.rm_gpu.get(
                (client, r["h_parent"]))
            a.rm_gpu[(client, handle)] = gpu
            return
        virtual = (r.get("flags") or 0) & NVOS32_ALLOC_FLAGS_VIRTUAL
        is_alloc = (name in ALLOCS and cls in MEMORY_CLASSES) or (
            name == VID_HEAP and size > 0 and not virtual)
        if is_alloc:
            a = self._allocs(pid)
            gpu = a.rm_gpu.get((client, r["h_parent"]), r["gpu_index"])
            p = self._proc(pid, r["comm"], now)
            old = a.rm.pop((client, handle), None)
            if old is not None:  # handle reused without a free we saw
                p.add_live("rm", old.gpu, -old.size)
            parent = r["h_parent"] or 0
            ts = r.get("ts_ns") or now
            what = LABELS[cls] if name in ALLOCS else "vid heap"
            a.rm[(client, handle)] = Item(size, gpu, ts, ts, r.get("tid"), what, handle,
                                          client, handle)
            a.rm_parent[(client, handle)] = parent
            a.rm_kids.setdefault((client, parent), set()).add(handle)
            p.add_live("rm", gpu, size)
            p.allocations["rm"] += 1
        elif name == "RM_FREE" or name == VID_HEAP:
            self._rm_free(pid, client, handle)

    def _rm_free(self, pid: int, client: int, handle: int) -> None:
        """An RM_FREE ends the object, its children, or (the client) all of them."""
        a = self._of.get(pid)
        if a is None:
            return
        if handle == client:
            gone = [k for k in a.rm if k[0] == client]
        else:
            gone = [(client, h) for h in a.rm_kids.get((client, handle), ())]
            if (client, handle) in a.rm:
                gone.append((client, handle))
        p = self._procs.get(pid)
        for k in gone:
            item = a.rm.pop(k)
            parent = a.rm_parent.pop(k, 0)
            kids = a.rm_kids.get((client, parent))
            if kids is not None:
                kids.discard(k[1])
                if not kids:
                    del a.rm_kids[(client, parent)]
            if p is not None:
                p.add_live("rm", item.gpu, -item.size)
                p.frees["rm"] += 1
        if handle == client:
            for k in [k for k in a.rm_gpu if k[0] == client]:
                del a.rm_gpu[k]
        else:
            a.rm_gpu.pop((client, handle), None)

    # ------------------------------------------------------------ uvm
    def uvm_row(self, r: dict[str, Any], now: int) -> None:
        """One UVM range or mapping row of `ioctls` (succeeded ones count)."""
        if (r["ret"] or 0) < 0 or (r["status"] or 0) != 0 or r["va_base"] is None:
            return
        pid, name, base = r["pid"], r["name"], r["va_base"]
        if name == UVM_RESERVE:
            self._allocs(pid).ranges.setdefault(base, r["va_length"] or 0)
        elif name == UVM_MAP:
            ts = r.get("ts_ns") or now
            end = ts + (r.get("latency_ns") or 0)
            self._uvm_open(pid, r["comm"], now, Item(
                r["va_length"] or 0, None, ts, end, r.get("tid"), _EXTERNAL, base,
                r["h_client"], r["h_object"]))
        else:  # UVM_FREE, UVM_UNMAP_EXTERNAL
            a = self._of.get(pid)
            if a is None:
                return
            self._uvm_close(pid, base, _EXTERNAL)
            length = a.ranges.pop(base, None) if name == "UVM_FREE" else None
            if length:  # the range's mappings end with it
                for what, b in [k for k in a.uvm
                                if k[0] == _EXTERNAL and base <= k[1] < base + length]:
                    self._uvm_close(pid, b, what)

    def mappings(self, t: pa.Table | pa.RecordBatch, now: int) -> None:
        """Fold appended `mappings` rows in: managed mmaps and the munmaps that end them."""
        cols = t.select(["pid", "tid", "comm", "ts_ns", "latency_ns", "op_code", "addr",
                         "length", "managed", "ret"]).to_pydict()
        for pid, tid, comm, ts, lat, op, addr, length, managed, ret in zip(
                *cols.values(), strict=True):
            if op == _MMAP and managed and (ret or 0) >= 0 and addr is not None:
                self._uvm_open(pid, comm, now, Item(length or 0, None, ts, ts + (lat or 0),
                                                    tid, _MANAGED, addr))
            elif op == _MUNMAP and (ret or 0) == 0 and addr is not None:
                self._uvm_close(pid, addr, _MANAGED)

    def _uvm_open(self, pid: int, comm: str | None, now: int, item: Item) -> None:
        a = self._allocs(pid)
        key = (item.what, item.ident)
        if key in a.uvm:  # consecutive opens of one base are one allocation
            return
        a.uvm[key] = item
        p = self._proc(pid, comm, now)
        p.add_live("uvm", None, item.size)
        p.allocations["uvm"] += 1

    def _uvm_close(self, pid: int, base: int, what: str) -> None:
        """End the mapping of kind `what` at `base`: a munmap ends a managed mmap only, an
        UVM_FREE or UVM_UNMAP_EXTERNAL an external mapping only (as uvm_ranges pairs)."""
        a = self._of.get(pid)
        if a is None or (item := a.uvm.pop((what, base), None)) is None:
            return
        p = self._procs.get(pid)
        if p is not None:
            p.add_live("uvm", None, -item.size)
            p.frees["uvm"] += 1

    # ------------------------------------------------------------ api
    def cuda_calls(self, t: pa.Table | pa.RecordBatch, now: int) -> None:
        """Fold appended `cuda_calls` rows in: allocations and the frees that end them."""
        cols = t.select(["pid", "tid", "comm", "ts_ns", "latency_ns", "func", "size_bytes",
                         "ptr", "handle", "result"]).to_pydict()
        for pid, tid, comm, ts, lat, func, size, ptr, handle, result in zip(
                *cols.values(), strict=True):
            base = _base(func)
            kind = _API_KIND.get(base)
            if kind is None or (result or 0) != 0:
                continue
            op, space = kind
            ident = handle if space == "handle" else ptr
            if not ident:
                continue
            key = (space == "handle", ident)
            p = self._proc(pid, comm, now)
            a = self._allocs(pid)
            if op == "alloc":
                old = a.api.pop(key, None)
                if old is not None:
                    p.add_live("api", None, -old.size)
                a.api[key] = Item(size or 0, None, ts, ts + (lat or 0), tid, base, ident)
                p.add_live("api", None, size or 0)
                p.allocations["api"] += 1
            elif (old := a.api.pop(key, None)) is not None:
                p.add_live("api", None, -old.size)
                p.frees["api"] += 1

    # ------------------------------------------------------------ one figure
    def count(self, pids: Iterable[int]) -> int:
        """Live allocations of `pids`, every layer: what a `held` of them walks."""
        return sum(len(a.api) + len(a.rm) + len(a.uvm)
                   for a in (self._of.get(p) for p in pids) if a is not None)

    def held(self, pids: Iterable[int]) -> dict[int, int]:
        """Per pid, the GPU memory it holds now: the offline join rules over its live
        allocations, each piece sized by one layer, host memory left out."""
        out = dict.fromkeys(pids, 0)
        want = [p for p in out if p in self._of]
        rows: dict[str, list[Any]] = {k: [] for k in _FRAME}
        for pid in want:
            a = self._of[pid]
            for layer, items in (("api", a.api.values()), ("rm", a.rm.values()),
                                 ("uvm", a.uvm.values())):
                for it in items:
                    for k, v in zip(_FRAME, (layer, pid, it.ident, it.what, it.size, it.ts,
                                             it.gpu, it.tid, it.end, it.client, it.handle),
                                    strict=True):
                        rows[k].append(v)
        if not rows["layer"]:
            return out
        lt = pl.DataFrame(rows, schema={k: COLUMNS[k] for k in _FRAME}).with_columns(
            free_ts_ns=pl.lit(None, pl.Int64))
        of_layer = pl.col("layer")
        pieces = link(lt).with_columns(_host=is_host_memory("what")).group_by("piece").agg(
            pl.col("pid").first(), pl.col("_host").any(),
            *((of_layer == k).sum().alias(f"{k}_count") for k in COUNTED_LAYERS),
            *(pl.col("size_bytes").filter(of_layer == k).sum().alias(f"{k}_bytes")
              for k in COUNTED_LAYERS))
        per = (pieces.filter(~pl.col("_host"))
               .group_by("pid").agg(of_size_layer("rm_bytes", "uvm_bytes", "api_bytes").sum()
                                    .alias("held")))
        for pid, held in per.iter_rows():
            out[pid] = int(held)
        return out


_FRAME = ("layer", "pid", "id", "what", "size_bytes", "alloc_ts_ns", "gpu_index", "tid",
          "call_end_ns", "client", "handle")
"""The lifetime columns (helpers.lifetimes.COLUMNS) the join rules read."""
