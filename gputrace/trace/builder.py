"""Build small synthetic traces from short scenarios (Perfetto-style test traces).

A scenario reads like the story it tells, with the answer written beside it::

    b = TraceBuilder()
    b.process(100, "train")
    h = b.rm_alloc(t=0.0, pid=100, size=4 * MiB)      # 4 MiB of vidmem at t=0
    b.rm_free(t=5.0, pid=100, handle=h)                # freed at t=5 s
    b.build(tmp_path / "trace")                        # a real trace directory

Times are seconds from the start of the trace. Everything built here is
synthetic and the manifest says so (`"synthetic": true`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from gputrace import nvabi, schema
from gputrace.trace.writer import write_tables

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
Frame = str | tuple[str, str] | tuple[str, str, int]
"""A stack frame: an executable's symbol, (symbol, module path), or a Python frame
(function, file, line)."""
T0_NS = 1_000_000_000_000
"""Monotonic time of t=0 in built traces (an arbitrary, realistic boot offset)."""

CLASS_ROOT_CLIENT = nvabi.NV01_ROOT_CLIENT
CLASS_DEVICE = nvabi.NV01_DEVICE_0
CLASS_SUBDEVICE = nvabi.NV20_SUBDEVICE_0
CLASS_VASPACE = nvabi.FERMI_VASPACE_A
CLASS_VIDMEM = nvabi.NV01_MEMORY_LOCAL_USER
CLASS_SYSMEM = nvabi.NV01_MEMORY_SYSTEM
CLASS_VIRTUAL = nvabi.NV50_MEMORY_VIRTUAL

RM_ALLOC_CMD = nvabi.iowr(nvabi.ESC_RM_ALLOC, 48)  # NVOS64, as libcuda issues it
RM_FREE_CMD = nvabi.iowr(nvabi.ESC_RM_FREE, 16)  # NVOS00
_CODES = {name: {v: k for k, v in values.items()} for name, values in schema.ENUMS.items()}
"""Each enum's codes by name (`row` fills a code its caller named)."""
UVM_CMDS = {"UVM_FREE": 34, "UVM_MAP_EXTERNAL_ALLOCATION": 33, "UVM_CREATE_EXTERNAL_RANGE": 73}


def ns(t: float) -> int:
    return T0_NS + round(t * 1e9)


class TraceBuilder:
    """Accumulates rows per table; `build` writes them as a trace directory."""

    def __init__(
        self,
        layers: Sequence[str] = ("syscall", "api", "driver"),
        *,
        duration_s: float | None = None,
        gpus: int = 1,
        gpu_memory_bytes: int = 80 * GiB,
        drops: dict[str, int] | None = None,
        status: str = "complete",
    ) -> None:
        self.layers = list(layers)
        self.duration_s = duration_s
        self.gpus = gpus
        self.gpu_memory_bytes = gpu_memory_bytes
        self.drops = drops or {}
        self.status = status
        self.rows: dict[str, list[dict[str, Any]]] = {n: [] for n in schema.TABLES}
        self._next_handle = 0xC1D00001
        self._next_ptr = 0x7F0000000000
        self._stacks: dict[tuple[int, tuple[Frame, ...]], int] = {}
        self._comm: dict[int, str] = {}
        self._max_t = 0.0

    # ------------------------------------------------------------ generic rows
    def row(self, table: str, **fields: Any) -> dict[str, Any]:
        """Add one row; an enum's name is filled from its code and a known name's code
        from the name, the rest is null."""
        t = schema.table(table)
        row: dict[str, Any] = dict.fromkeys((c.name for c in t.columns), None)
        for k, v in fields.items():
            if k not in row:
                raise KeyError(f"{table} has no column {k!r}")
            row[k] = v
        for enum_col, values in schema.ENUMS.items():
            code_col = f"{enum_col}_code"
            if code_col not in row:
                continue
            if row[code_col] is not None and row[enum_col] is None:
                row[enum_col] = values[row[code_col]]
            elif row[code_col] is None and row[enum_col] is not None:
                row[code_col] = _CODES[enum_col].get(row[enum_col])
        if "comm" in row and row["comm"] is None and row.get("pid") is not None:
            row["comm"] = self._comm.get(row["pid"], f"pid{row['pid']}")
        if "tid" in row and row["tid"] is None and row.get("pid") is not None:
            row["tid"] = row["pid"]
        if row.get("ts_ns") is not None:
            self._max_t = max(self._max_t, (row["ts_ns"] - T0_NS) / 1e9)
        self.rows[table].append(row)
        return row

    def _handle(self) -> int:
        self._next_handle += 1
        return self._next_handle

    # --------------------------------------------------------------- processes
    def process(
        self,
        pid: int,
        comm: str,
        *,
        start: float | None = 0.0,
        exit: float | None = None,
        ppid: int = 1,
        cmdline: str | None = None,
        cgroup: str | None = None,
        zombie_threads: int | None = None,
        **who: str | None,
    ) -> None:
        """A process row; `who`: its identity columns (schema.IDENTITY_COLUMNS:
        container_id, pod_uid, pod_namespace, ...); `zombie_threads`: threads its main
        thread left running at `exit`."""
        known = {c.name for c in schema.IDENTITY_COLUMNS}
        if set(who) - known:
            raise TypeError(f"process(): not an identity column: {sorted(set(who) - known)}")
        self._comm[pid] = comm
        self.row(
            "processes",
            pid=pid,
            ppid=ppid,
            comm=comm,
            exe=f"/usr/bin/{comm}",
            cmdline=cmdline or comm,
            cgroup=cgroup,
            start_ts_ns=None if start is None else ns(start),
            exit_ts_ns=None if exit is None else ns(exit),
            exit_code=None if exit is None else 0,
            zombie_threads=zombie_threads,
            **who,
        )

    # ---------------------------------------------------------------- RM layer
    def ioctl(self, t: float, pid: int, name: str, **fields: Any) -> dict[str, Any]:
        device_code = fields.pop("device_code", 1)
        defaults: dict[str, Any] = {
            "fd": 3,
            "cmd": 0,
            "nr": 0,
            "ret": 0,
            "status": 0,
            "latency_ns": 2_000,
        }
        defaults.update(fields)
        return self.row("ioctls", ts_ns=ns(t), pid=pid, device_code=device_code, name=name,
                        **defaults)

    def rm_alloc(
        self,
        t: float,
        pid: int,
        *,
        size: int = 0,
        h_class: int = CLASS_VIDMEM,
        handle: int | None = None,
        client: int = 0xC1D00000,
        parent: int | None = None,
        status: int = 0,
        gpu: int = 0,
    ) -> int:
        """RM_ALLOC of an object; returns its handle (reuse it to model reuse)."""
        h = self._handle() if handle is None else handle
        self.ioctl(
            t, pid, "RM_ALLOC", cmd=RM_ALLOC_CMD, nr=nvabi.ESC_RM_ALLOC, h_client=client,
            h_parent=client if parent is None else parent, h_object=h, h_class=h_class,
            size_bytes=size if size else None, status=status,
            gpu_index=gpu if h_class == CLASS_DEVICE else None,
            flags=0, attr=0, attr2=0, alignment=0 if size else None,
        )
        return h

    def rm_free(self, t: float, pid: int, *, handle: int, client: int = 0xC1D00000,
                parent: int | None = None, status: int = 0) -> None:
        self.ioctl(t, pid, "RM_FREE", cmd=RM_FREE_CMD, nr=nvabi.ESC_RM_FREE, h_client=client,
                   h_parent=client if parent is None else parent, h_object=handle,
                   status=status)

    def open_fd(self, t: float, pid: int, *, fd: int = 3, device_code: int = 1,
                seen: bool = False) -> None:
        """open(2) of an NVIDIA device (or, with seen, an fd open before recording)."""
        self.row("files", ts_ns=ns(t), pid=pid, fd_op_code=4 if seen else 1,
                 device_code=device_code, fd=fd, ret=None if seen else fd)

    def dup_fd(self, t: float, pid: int, *, fd: int, new_fd: int, device_code: int = 1) -> None:
        self.row("files", ts_ns=ns(t), pid=pid, fd_op_code=3, device_code=device_code, fd=fd,
                 new_fd=new_fd, ret=new_fd)

    def close(self, t: float, pid: int, *, fd: int = 3, device_code: int = 1) -> None:
        """close(2) of an NVIDIA fd (the RM frees the clients a control fd still holds
        when its last reference closes)."""
        self.row("files", ts_ns=ns(t), pid=pid, fd_op_code=2, device_code=device_code, fd=fd,
                 ret=0)

    def uvm(self, t: float, pid: int, name: str, *, base: int | None = None,
            length: int | None = None, h_object: int | None = None, status: int = 0) -> None:
        nr = UVM_CMDS.get(name, 0)
        self.ioctl(t, pid, name, device_code=3, fd=4, cmd=nr, nr=nr, va_base=base,
                   va_length=length, h_object=h_object, status=status)

    def mmap_managed(self, t: float, pid: int, addr: int, length: int) -> None:
        self.row("mappings", ts_ns=ns(t), pid=pid, op_code=1, device_code=3, fd=4, addr=addr,
                 length=length, offset=addr, prot=3, flags=1, ret=addr, managed=True,
                 latency_ns=5_000)

    def munmap(self, t: float, pid: int, addr: int, length: int) -> None:
        self.row("mappings", ts_ns=ns(t), pid=pid, op_code=2, device_code=3, fd=-1, addr=addr,
                 length=length, ret=0, managed=True, latency_ns=5_000)

    # --------------------------------------------------------------- API layer
    def stack(self, pid: int, frames: Sequence[Frame]) -> int:
        """Intern a call stack (innermost first) for pid; returns its stack id. A frame
        is a symbol of the program's executable, (symbol, module path), or a Python
        frame (function, file, line) as the recorder merges them."""
        key = (pid, tuple(frames))
        if key not in self._stacks:
            sid = len(self._stacks) + 1
            self._stacks[key] = sid
            for depth, frame in enumerate(frames):
                ip, offset = 0x400000 + 0x100 * depth + sid, 0x100 * depth + sid
                if isinstance(frame, tuple) and len(frame) == 3:
                    self.row("stacks", pid=pid, stack_id=sid, depth=depth, ip=ip,
                             offset=offset, kind="python", function=frame[0],
                             filename=frame[1], line=frame[2])  # fmt: skip
                    continue
                sym, module = (frame if isinstance(frame, tuple)
                               else (frame, f"/usr/bin/{self._comm.get(pid, 'a.out')}"))
                self.row("stacks", pid=pid, stack_id=sid, depth=depth, ip=ip, module=module,
                         offset=offset, symbol=sym)  # fmt: skip
        return self._stacks[key]

    def cuda_alloc(self, t: float, pid: int, size: int, *, func: str = "cuMemAlloc_v2",
                   ptr: int | None = None, result: int = 0,
                   stack: Sequence[Frame] | None = None) -> int:
        """A cuMemAlloc-family call; returns the pointer (0 when it failed)."""
        if ptr is None:
            ptr = self._next_ptr if result == 0 else 0
            self._next_ptr += max(size, 512) + (-max(size, 512)) % 512
        sid = self.stack(pid, stack) if stack else None
        self.row("cuda_calls", ts_ns=ns(t), pid=pid, func=func, size_bytes=size, ptr=ptr,
                 result=result, latency_ns=10_000, stack_id=sid)
        return ptr

    def cuda_free(self, t: float, pid: int, ptr: int, *, func: str = "cuMemFree_v2",
                  result: int = 0) -> None:
        self.row("cuda_calls", ts_ns=ns(t), pid=pid, func=func, ptr=ptr, result=result,
                 latency_ns=8_000)

    # ------------------------------------------------------------ driver layer
    def cpu_fault(self, t: float, pid: int, address: int, *, write: bool) -> None:
        self.row("faults", ts_ns=ns(t), pid=pid, tid=pid, source_code=1, address=address,
                 block_2m=address & ~(2 * MiB - 1), fault_type_code=255,
                 access_type_code=2 if write else 1, ip=0x401000)

    def gpu_fault(self, t: float, gpu: int, address: int, *, pid: int | None = None,
                  access: int = 1, batch_id: int = 0, instances: int = 1,
                  fault_type: int = 1) -> None:
        self.row("faults", ts_ns=ns(t), pid=pid, source_code=2, gpu_index=gpu, address=address,
                 block_2m=address & ~(2 * MiB - 1), fault_type_code=fault_type,
                 access_type_code=access, instances=instances, batch_id=batch_id)

    def fault_batch(self, t: float, gpu: int, batch_id: int, faults: int, duplicates: int,
                    duration_s: float, *, pid: int | None = None) -> None:
        self.row("fault_batches", ts_ns=ns(t), gpu_index=gpu, batch_id=batch_id, faults=faults,
                 duplicates=duplicates, duration_ns=round(duration_s * 1e9), pid=pid)

    def migration(self, t: float, src: int, dst: int, address: int, size: int, *,
                  cause: int = 1, pid: int | None = None) -> None:
        """A migration from processor src to dst (trace GPU indices, -1 = CPU)."""
        self.row("migrations", ts_ns=ns(t), pid=pid, src=src, dst=dst, address=address,
                 size_bytes=size, cause_code=cause, duration_ns=50_000)

    def uvm_event(self, t: float, pid: int, kind: str, address: int, *,
                  size: int | None = None, processor: int | None = None,
                  residency: int | None = None, processors: Sequence[int] = (),
                  reason: str | None = None) -> None:
        """A uvm_events row (thrashing, throttling_start/end, map_remote, ...)."""
        codes = {v: k for k, v in schema.UVM_EVENT_KINDS.items()}
        reasons = {v: k for k, v in schema.UVM_EVENT_REASONS.items()}
        self.row("uvm_events", ts_ns=ns(t), pid=pid, kind_code=codes[kind], address=address,
                 size_bytes=size, processor=processor, residency=residency,
                 processors=",".join(map(str, processors)) if processors else None,
                 reason_code=None if reason is None else reasons[reason])

    def uvm_counter(self, t: float, pid: int, counter: str, value: int) -> None:
        code = {v: k for k, v in schema.UVM_COUNTERS.items()}[counter]
        self.row("uvm_counters", ts_ns=ns(t), pid=pid, counter_code=code, value=value)

    def gpu_memory(self, t: float, gpu: int, *, heap: int, free: int, largest: int,
                   base: int = 0, status: int = 0, trigger: str | None = None,
                   delay_ns: int | None = None) -> None:
        """An RM memory sample of one GPU (sizes in bytes; null when status != 0);
        `trigger` "tick" or "incident" (null: a trace older than the column)."""
        ok = status == 0
        self.row("gpu_memory", ts_ns=ns(t), gpu_index=gpu, status=status,
                 heap_size_bytes=heap if ok else None, heap_free_bytes=free if ok else None,
                 largest_free_bytes=largest if ok else None,
                 largest_free_base_bytes=base if ok else None, trigger=trigger,
                 delay_ns=delay_ns)

    def gpu_process_memory(self, t: float, gpu: int, pid: int, vidmem: int | None, *,
                           trigger: str = "tick", status: int = 0) -> None:
        """The driver's account of one process's video memory on one GPU (bytes; null
        when status != 0)."""
        self.row("gpu_process_memory", ts_ns=ns(t), gpu_index=gpu, pid=pid,
                 vidmem_bytes=vidmem if status == 0 else None, trigger=trigger, status=status)

    def chunk(self, t: float, gpu: int, op: str, address: int, log2_size: int, *,
              mem_type: int = 0, pid: int | None = None) -> None:
        code = {v: k for k, v in schema.CHUNK_OPS.items()}[op]
        self.row("chunks", ts_ns=ns(t), gpu_index=gpu, chunk_op_code=code, address=address,
                 log2_size=log2_size, mem_type_code=mem_type, pid=pid)

    # ------------------------------------------------------------------- build
    def manifest(self) -> dict[str, Any]:
        end = self.duration_s if self.duration_s is not None else self._max_t
        return {
            "synthetic": True,
            "status": self.status,
            "layers": self.layers,
            "host": {"hostname": "synthetic", "kernel": "synthetic", "machine": "x86_64"},
            "driver_version": "580.142",
            "gpus": [
                {"index": i, "memory_bytes": self.gpu_memory_bytes, "name": "synthetic GPU"}
                for i in range(self.gpus)
            ],
            "clock": {"realtime_offset_ns": 1_767_225_600_000_000_000 - T0_NS},
            "start_ts_ns": T0_NS,
            "end_ts_ns": ns(end),
            "drops": self.drops,
            "target": {"mode": "synthetic"},
            "hooks": {"attached": [], "skipped": []},
        }

    def build(self, path: str | os.PathLike[str], *, force: bool = False) -> Path:
        tables = {
            name: pa.Table.from_pylist(rows, schema=schema.table(name).arrow_schema)
            for name, rows in self.rows.items()
            if rows
        }
        manifest = self.manifest()
        status = manifest.pop("status")
        return write_tables(path, tables, manifest=manifest, force=force, status=status)
