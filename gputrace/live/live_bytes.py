"""Live bytes per process, layer and GPU, as a recording appends its tables: each
allocation paired with what ends it.

- `api`: cuda_calls allocations paired with their frees by (pid, pointer or
  handle), as the offline lifetimes pair them (gputrace.analyses.helpers.lifetimes);
  failed calls never count; address reservations are not memory.
- `rm`: RM_ALLOC / RM_ALLOC_MEMORY of the memory classes and RM_VID_HEAP_CONTROL
  allocations, ended by their own RM_FREE, the RM_FREE of their parent or of
  their client (gputrace.analyses.helpers.rm_objects; fd releases are not followed live).
  The GPU is that of the RM device (class 0x80) the object hangs under.

A process's memory ends with it: `forget(pid)` when its exit is seen. `Proc`
holds one process's running totals, which `LiveBytes` and `Aggregates` update.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from gputrace.analyses.helpers.lifetimes import API_ALLOCS, API_FREES
from gputrace.analyses.helpers.rm_objects import ALLOCS, VID_HEAP
from gputrace.nvabi import MEMORY_CLASSES
from gputrace.nvabi import NV01_DEVICE_0 as DEVICE_CLASS
from gputrace.nvabi import NV20_SUBDEVICE_0 as SUBDEVICE_CLASS

COUNTED_LAYERS = ("api", "rm")  # the `layer` values live bytes are counted for
_API_KIND = {**{f: ("alloc", k) for f, k in API_ALLOCS.items()},
             **{f: ("free", k) for f, k in API_FREES.items()}}


def _base(func: str) -> str:
    """cuMemAlloc_v2, cuMemFreeAsync_ptsz -> cuMemAlloc, cuMemFreeAsync."""
    for suffix in ("_ptsz", "_ptds"):
        if func.endswith(suffix):
            func = func[: -len(suffix)]
    head, _, tail = func.rpartition("_v")
    return head if head and tail.isdigit() else func


@dataclass
class Proc:
    """One process's running totals."""

    pid: int
    comm: str = ""
    first_ns: int = 0
    who: tuple[str, str, str] = ("", "", "")  # (namespace, pod, container): Identity.labels
    live: Counter[tuple[str, int | None]] = field(default_factory=Counter)  # (layer, gpu)
    allocations: Counter[str] = field(default_factory=Counter)  # per layer
    frees: Counter[str] = field(default_factory=Counter)
    gpu_faults: int = 0
    cpu_faults: int = 0
    migrations: int = 0
    # (ts_ns, live total) at each change, pruned to the growth window (plus one before it)
    history: deque[tuple[int, int]] = field(default_factory=deque)
    # (ts_ns, allocations, frees, gpu faults, migrations) samples for the event rates
    samples: deque[tuple[int, int, int, int, int]] = field(default_factory=deque)

    @property
    def live_total(self) -> int:
        """The process's one figure: the live bytes of its largest layer. The layers see
        the same memory (an API allocation lies in an RM object), so they are never
        added; the RM layer, when recorded, holds what the driver accounts (the API's
        allocations and the CUDA context), the API layer alone what the program asked."""
        per: Counter[str] = Counter()
        for (layer, _gpu), n in self.live.items():
            per[layer] += n
        return max(per.values(), default=0)

    def add_live(self, layer: str, gpu: int | None, delta: int) -> None:
        """Live bytes of (layer, gpu) change by `delta`; a series at zero goes away."""
        key = (layer, gpu)
        self.live[key] += delta
        if self.live[key] <= 0:
            del self.live[key]


class LiveBytes:
    """The allocations alive now, per process: API pointers and handles, RM memory
    objects (with the GPU of their device and the objects under each parent)."""

    def __init__(self, procs: dict[int, Proc],
                 proc: Callable[[int, str | None, int], Proc]) -> None:
        self._procs = procs  # looked up (never created) when a free ends an object
        self._proc = proc  # the process's totals, created at first sight
        self._api: dict[tuple[int, bool, int], tuple[int, str]] = {}  # -> (size, layer key)
        self._rm: dict[tuple[int, int, int], tuple[int, int | None, int]] = {}
        self._rm_gpu: dict[tuple[int, int, int], int | None] = {}  # devices, subdevices
        # (pid, client, parent) -> handles of live memory objects under that parent
        self._rm_kids: dict[tuple[int, int, int], set[int]] = {}

    def forget(self, pid: int) -> None:
        """The process exited: its allocations go with it."""
        self._api = {k: v for k, v in self._api.items() if k[0] != pid}
        self._rm = {k: v for k, v in self._rm.items() if k[0] != pid}
        self._rm_gpu = {k: v for k, v in self._rm_gpu.items() if k[0] != pid}
        self._rm_kids = {k: v for k, v in self._rm_kids.items() if k[0] != pid}

    def rm_row(self, r: dict[str, Any], now: int) -> None:
        """One RM alloc or free row of `ioctls` (succeeded ones count)."""
        if (r["ret"] or 0) != 0 or (r["status"] or 0) != 0:
            return
        pid, client, handle = r["pid"], r["h_client"], r["h_object"]
        if client is None or handle is None:
            return
        name, cls, size = r["name"], r["h_class"], r["size_bytes"] or 0
        if name in ALLOCS and cls in (DEVICE_CLASS, SUBDEVICE_CLASS):
            gpu = r["gpu_index"] if cls == DEVICE_CLASS else self._rm_gpu.get(
                (pid, client, r["h_parent"]))
            self._rm_gpu[(pid, client, handle)] = gpu
            return
        is_alloc = (name in ALLOCS and cls in MEMORY_CLASSES) or (name == VID_HEAP and size > 0)
        if is_alloc:
            gpu = self._rm_gpu.get((pid, client, r["h_parent"]), r["gpu_index"])
            p = self._proc(pid, r["comm"], now)
            old = self._rm.pop((pid, client, handle), None)
            if old is not None:  # handle reused without a free we saw
                p.add_live("rm", old[1], -old[0])
            parent = r["h_parent"] or 0
            self._rm[(pid, client, handle)] = (size, gpu, parent)
            self._rm_kids.setdefault((pid, client, parent), set()).add(handle)
            p.add_live("rm", gpu, size)
            p.allocations["rm"] += 1
        elif name == "RM_FREE" or name == VID_HEAP:
            self._rm_free(pid, client, handle, now)

    def _rm_free(self, pid: int, client: int, handle: int, now: int) -> None:
        """An RM_FREE ends the object, its children, or (the client) all of them."""
        if handle == client:
            gone = [k for k in self._rm if k[0] == pid and k[1] == client]
        else:
            gone = [(pid, client, h) for h in self._rm_kids.get((pid, client, handle), ())]
            if (pid, client, handle) in self._rm:
                gone.append((pid, client, handle))
        p = self._procs.get(pid)
        for k in gone:
            size, gpu, parent = self._rm.pop(k)
            kids = self._rm_kids.get((pid, client, parent))
            if kids is not None:
                kids.discard(k[2])
                if not kids:
                    del self._rm_kids[(pid, client, parent)]
            if p is not None:
                p.add_live("rm", gpu, -size)
                p.frees["rm"] += 1
        if handle == client:
            for k in [k for k in self._rm_gpu if k[0] == pid and k[1] == client]:
                del self._rm_gpu[k]
        else:
            self._rm_gpu.pop((pid, client, handle), None)

    def cuda_calls(self, t: pa.Table | pa.RecordBatch, now: int) -> None:
        """Fold appended `cuda_calls` rows in: allocations and the frees that end them."""
        cols = t.select(["pid", "comm", "func", "size_bytes", "ptr", "handle",
                         "result"]).to_pydict()
        for pid, comm, func, size, ptr, handle, result in zip(*cols.values(), strict=True):
            kind = _API_KIND.get(_base(func))
            if kind is None or (result or 0) != 0:
                continue
            op, space = kind
            ident = handle if space == "handle" else ptr
            if not ident:
                continue
            key = (pid, space == "handle", ident)
            p = self._proc(pid, comm, now)
            if op == "alloc":
                old = self._api.pop(key, None)
                if old is not None:
                    p.add_live("api", None, -old[0])
                self._api[key] = (size or 0, func)
                p.add_live("api", None, size or 0)
                p.allocations["api"] += 1
            elif (old := self._api.pop(key, None)) is not None:
                p.add_live("api", None, -old[0])
                p.frees["api"] += 1
