"""The torch_allocator layer: PyTorch's CUDA caching allocator, traced live from outside
(probes/torch_allocator.bpf.c, compiled into the API layer's program; docs/record.md
"The torch_allocator layer").

Every process that maps a libc10_cuda.so (launched, `-p`, or the whole host, found by
the API layer's library watch) gets uprobes on NativeCachingAllocator::malloc (entry
and its `ret` instructions) and ::free, and on the cudaMallocAsync backend's
mallocAsync and freeAsync where the file has them, found by mangled name (symbols.py);
libcuda's segment calls are the API layer's targets (LIBCUDA_PROBES); each tensor
and segment becomes a row of `allocator_events`, its stack rows of `stacks` and
`allocator_frames`, and what is alive at the end `allocator_segments` and
`allocator_blocks`: the tables `gputrace import torch-snapshot` writes, so every
allocator report reads a live recording. A libc10_cuda whose entry points are not
known is skipped with its reason in the manifest (`torch_allocator.skipped`), never
probed at a guess.
"""

from __future__ import annotations

import contextlib
import ctypes
import time
from typing import Any, ClassVar

import pyarrow as pa

from gputrace import schema
from gputrace.errors import UsageError
from gputrace.record import loader
from gputrace.record.api.extension import Extension
from gputrace.record.layer import Buffer, Decoded, Due, Layer
from gputrace.record.session import Session
from gputrace.record.torch_allocator import decode, symbols

BUFFER = "torch_events"
RB_PAGES = 1024  # 4 MiB: ~70k tensor events between polls
STACKS = {"none": 0, "python": 1, "full": 2}
"""--torch-stacks: the probe's GT_TORCH_STACKS."""
LIBRARY_RE = r"^libc10_cuda\.so(\.[\w.]+)?$"
FREE_FN = {1: "torch_free_arg1_enter", 2: "torch_free_enter"}
"""The probe function of a free whose pointer is in argument 1 or 2."""
LIBCUDA_PROBES = (("cuMemAlloc_v2", "torch_seg_alloc_enter", "torch_seg_alloc_ret"),
                  ("cuMemFree_v2", "torch_seg_free_enter", ""),
                  ("cuMemCreate", "", "torch_seg_try_ret"),
                  ("cuMemMap", "torch_seg_map_enter", "torch_seg_map_ret"),
                  ("cuMemUnmap", "torch_seg_unmap_enter", ""),
                  ("cuMemAllocAsync", "", "torch_seg_try_ret"),
                  ("cuMemAllocAsync_ptsz", "", "torch_seg_try_ret"),
                  ("cuMemFreeAsync", "torch_release_enter", ""),
                  ("cuMemFreeAsync_ptsz", "torch_release_enter", ""))
"""libcuda calls the allocator makes: segments (cuMemAlloc_v2/cuMemFree_v2), pages of
expandable segments (cuMemMap/cuMemUnmap), out-of-memory failures (cuMemCreate,
cuMemAllocAsync) and the async backend's releases (cuMemFreeAsync)."""


def probe_source() -> str:
    """The layer's BPF text (compiled after the API layer's, in its program)."""
    return loader.probe_source(loader.PROBES, "torch_allocator.bpf.c")


def _events(layer: TorchAllocatorLayer, _s: Session, _kind: str, data: Any) -> Decoded:
    raw, stack_of = data
    ev, bad = decode.records(raw)
    return layer.state.rows(ev, stack_of), bad


class TorchAllocatorLayer(Layer):
    name = "torch_allocator"
    trace_layer = "allocator"
    RECORDS: ClassVar[dict[str, tuple[str, ...]]] = {"allocator": ("uprobes",)}
    builds_first = True
    BUFFERS: ClassVar[dict[str, Buffer]] = {
        "torch:events": Buffer("allocator_events", BUFFER, decode.TORCH_DTYPE, _events),
    }

    def __init__(self, stacks: str) -> None:
        self.stacks = stacks
        self.api: Any = None
        self.raw: list[bytes] = []
        self.state = decode.AllocatorState(realtime_offset_ns=time.time_ns()
                                           - time.clock_gettime_ns(time.CLOCK_MONOTONIC))
        self.libraries: list[dict[str, Any]] = []
        self.skipped: list[dict[str, str]] = []
        self.attached: list[str] = []
        self.stack_ids: dict[tuple[int, int], int] = {}  # (pid, stack key) -> allocator id
        self.next_stack_id = 1  # never reused: the ids of processes gone stay in the trace
        self.changed = True
        self.drops = 0

    @classmethod
    def validate(cls, opts: Any, prefix: str) -> Any:
        mode = getattr(opts, "torch_stacks", "python")
        if mode not in STACKS:
            raise UsageError(f"--torch-stacks must be none, python or full, not {mode!r}")
        return mode

    @classmethod
    def build(cls, s: Session, prepared: Any) -> TorchAllocatorLayer:
        source = probe_source()
        flags = [f"-DGT_TORCH_STACKS={STACKS[prepared]}", f"-DGT_TORCH_RB_PAGES={RB_PAGES}"]
        s.api_extensions.append(Extension(source, flags, LIBCUDA_PROBES))
        return cls(prepared)

    @property
    def hooks(self) -> int:
        return len(self.attached)

    def attach(self, s: Session) -> None:
        """Before the API layer's attach: its start finds the libraries already mapped."""
        self.api = s.api
        self.api.rings.open(self.api.bpf[BUFFER].map_fd, self.raw.append)
        self.api.libraries_watch.subscribe(LIBRARY_RE, self.on_library)

    def on_library(self, path: str, shown: str, pid: int) -> None:
        """A libc10_cuda.so mapped by `pid` (once per file): probe it, or say why not."""
        try:
            entry = symbols.find(path)
        except (symbols.SymbolsMissing, OSError) as e:
            self.skipped.append({"name": f"torch_allocator@{shown}", "reason": str(e)})
            self.changed = True
            return
        bpf, names = self.api.bpf, []
        nat, asy = "NativeCachingAllocator::", "CudaMallocAsync::"
        points = [("torch_malloc_enter", entry.malloc, f"{nat}malloc"),
                  *(("torch_malloc_ret", r, f"{nat}malloc+{r - entry.malloc:#x}")
                    for r in entry.malloc_rets),
                  *((FREE_FN[arg], addr, f"{nat}free@{addr:#x}") for addr, arg in entry.frees)]
        if entry.async_malloc:  # the cudaMallocAsync backend, in the same file
            points += [("torch_malloc_async_enter", entry.async_malloc, f"{asy}mallocAsync"),
                       *(("torch_malloc_ret", r, f"{asy}mallocAsync+{r - entry.async_malloc:#x}")
                         for r in entry.async_rets),
                       ("torch_free_async_enter", entry.async_free, f"{asy}freeAsync")]
        if entry.defer:  # a free that waits for other streams, and its block's release
            points += [("torch_defer_enter", entry.defer, "DeviceCachingAllocator::insert_events"),
                       ("torch_free_block_enter", entry.release_block,
                        "DeviceCachingAllocator::free_block")]
        try:
            for fn, addr, label in points:
                bpf.attach_uprobe(name=path, addr=addr, fn_name=fn)
                names.append(f"uprobe:{label}@{shown}")
        except Exception as e:  # bcc raises a bare Exception; what attached is detached
            for _fn, addr, _label in points[:len(names)]:
                with contextlib.suppress(Exception):
                    bpf.detach_uprobe(name=path, addr=addr)
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            self.skipped.append({"name": f"torch_allocator@{shown}",
                                 "reason": f"attach failed: {first}"})
            self.changed = True
            return
        self.attached += names
        self.libraries.append({"path": shown, "release": entry.release, "pid": pid,
                               "backends": ["native", "cudaMallocAsync"]
                               if entry.async_malloc else ["native"]})
        self.changed = True

    def drain(self, s: Session, due: Due) -> list[tuple[str, Any]]:
        # the API layer drains after this one: its ring buffer and ours are consumed here
        # too, so the last events are taken at the final drain
        self.api.rings.consume()
        items: list[tuple[str, Any]] = []
        if self.raw:
            data = b"".join(self.raw)
            self.raw.clear()
            stack_of, rows = self._stacks(data)
            if rows:
                items.append(("torch:stacks", rows))
            items.append(("torch:events", (data, stack_of)))
        if due is not Due.POLL:
            self.drops = int(sum(self.api.bpf["torch_drops"][ctypes.c_int(0)]))
        if due is Due.FINAL:
            items.append(("torch:state", None))
        if self.changed or items:
            self.changed = False
            items.append(("torch:manifest", self._manifest()))
        return items

    def _stacks(self, data: bytes) -> tuple[dict[tuple[int, int], int], list[dict[str, Any]]]:
        """Allocator stack ids of the events' stacks, and their new `stacks` rows."""
        ev, _bad = decode.records(data)
        keys = decode.decode_keys(ev)
        stack_of: dict[tuple[int, int], int] = {}
        for pid, key in set(zip(ev["pid"].tolist(), keys.tolist(), strict=True)):
            if key >= 0:
                sid = self.stack_ids.get((pid, key))
                if sid is None:
                    sid = self.stack_ids[(pid, key)] = self.next_stack_id
                    self.next_stack_id += 1
                stack_of[(pid, key)] = sid
        rows = self.api.stack_rows(ev) if len(ev) else []
        return stack_of, rows

    def write(self, s: Session, kind: str, data: Any) -> None:
        if kind == "torch:stacks":
            s.append("stacks", pa.Table.from_pylist(data, schema=schema.STACKS.arrow_schema))
            frames = frames_table(data, self.stack_ids)
            if frames.num_rows:
                s.append("allocator_frames", frames)
        elif kind == "torch:state":
            ooms = self.state.unsettled()
            if ooms is not None:
                s.append("allocator_events", ooms)
            for table, rows in self.state.state_tables().items():
                if rows.num_rows:
                    s.append(table, rows)
        elif kind == "torch:manifest":
            s.merge_manifest(data)

    def _manifest(self) -> dict[str, Any]:
        frag: dict[str, Any] = {"torch_allocator": {
            "stacks": self.stacks, "libraries": list(self.libraries),
            "attached": list(self.attached), "skipped": list(self.skipped)}}
        if self.attached:
            frag["layers"] = ["allocator"]
        return frag

    def manifest(self, s: Session, m: dict[str, Any]) -> dict[str, Any]:
        return {"drops": {BUFFER: self.drops}}

    def housekeep(self, s: Session, gone: set[int]) -> None:
        self.stack_ids = {k: v for k, v in self.stack_ids.items() if k[0] not in gone}
        if self.api is not None:
            tbl = self.api.bpf["torch_pids"]
            for pid in gone:
                with contextlib.suppress(KeyError):
                    del tbl[ctypes.c_uint(pid)]
            deferred = self.api.bpf["torch_deferred"]  # blocks of processes gone
            for k in [k for k in deferred if k.pid in gone]:
                with contextlib.suppress(KeyError):
                    del deferred[k]


def frames_table(rows: list[dict[str, Any]], stack_ids: dict[tuple[int, int], int]) -> pa.Table:
    """allocator_frames rows of `stacks` rows: Python frames as they are, native ones
    as `symbol (module)` with no line."""
    cols: dict[str, list[Any]] = {c.name: [] for c in schema.ALLOCATOR_FRAMES.columns}
    for r in rows:
        sid = stack_ids.get((r["pid"], r["stack_id"]))
        if sid is None:
            continue
        py = r.get("kind") == "python"
        for k, v in (("stack_id", sid), ("depth", r["depth"]),
                     ("function", r.get("function") if py else r.get("symbol")),
                     ("filename", r.get("filename") if py else r.get("module")),
                     ("line", r.get("line") if py else None)):
            cols[k].append(v)
    return pa.Table.from_pydict(cols, schema=schema.ALLOCATOR_FRAMES.arrow_schema)
