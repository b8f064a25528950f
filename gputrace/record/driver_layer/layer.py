"""The driver layer in the recorder: UVM tools trackers on the traced processes
and RM GPU memory sampling (`gputrace/record/driver_layer/poller.py`; docs/driver-layer.md)."""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gputrace import schema
from gputrace.errors import UsageError
from gputrace.record import procfs
from gputrace.record.driver_layer import poller as driver_layer
from gputrace.record.layer import Buffer, Decoded, Due, Layer
from gputrace.record.session import Session
from gputrace.record.uvm_tools import tracker as uvm_tools

UVM_RECORD = np.dtype((np.void, 72))  # a V2 tools record: the unit of uvm_tools decode_errors


def _ready(_layer: Any, _s: Session, _kind: str, data: pa.Table) -> Decoded:
    """A table the driver layer already decoded."""
    return data, 0


def with_comm(s: Session, table: pa.Table) -> pa.Table:
    """Tools-stream fault rows carry no process name: fill `comm` from what the
    recorder knows of the tracked process (its name, not the thread's)."""
    i = table.schema.get_field_index("comm")
    if i < 0 or not table.num_rows or table.column(i).null_count < table.num_rows:
        return table
    pids = table.column("pid")
    pid_list: list[int] = pc.unique(pids).drop_null().to_numpy().tolist()
    names = {p: c for p in pid_list if (c := s.comm(p)) is not None}
    if not names:
        return table
    idx = pc.index_in(pids, value_set=pa.array(list(names), pa.int32()))
    comm = pc.take(pa.array(list(names.values()), pa.string()), idx)
    return table.set_column(i, table.schema.field(i), comm.cast(table.schema.field(i).type))


class DriverLayer(Layer):
    name = "driver"
    RECORDS: ClassVar[dict[str, tuple[str, ...]]] = {"uvm_tools": ("uvm-tools",),
                                                     "rm_query": ("rm-client",)}
    BUFFERS: ClassVar[dict[str, Buffer]] = {}  # tables arrive decoded (see write)
    TOOLS = Buffer("", "uvm_tools", UVM_RECORD, _ready)

    def __init__(self, layer: driver_layer.DriverPoller) -> None:
        self.layer = layer
        self.no_tracker: set[int] = set()  # pids that initialized UVM but got no tracker
        self._bad = 0  # the decoder's bad records, already counted
        self._due = threading.Event()  # a driver poll is queued for the writer thread
        self._started = False

    @classmethod
    def validate(cls, opts: Any, prefix: str) -> driver_layer.DriverPoller | None:
        """The driver layer, unless turned off or the device folder has neither
        nvidia-uvm-tools nor nvidiactl (nothing it could open). Built, not started."""
        if not opts.driver_layer:
            return None
        try:  # built first: its options are refused even where it would not run
            layer = driver_layer.DriverPoller(
                prefix, opts.driver_version, queue_entries=opts.uvm_queue_entries,
                sample_ms=opts.sample_ms, pid_sample_ms=opts.pid_sample_ms,
                rm=os.path.exists(prefix + "nvidiactl"),
                queue_version=opts.uvm_queue_version,
            )  # fmt: skip
        except uvm_tools.ToolsError as e:
            raise UsageError(str(e)) from None
        if not any(os.path.exists(prefix + n) for n in ("nvidia-uvm-tools", "nvidiactl")):
            return None
        return layer

    @classmethod
    def build(cls, s: Session, prepared: Any) -> DriverLayer | None:
        if prepared is None:
            return None
        s.decode_errors.setdefault("uvm_tools", 0)
        return cls(prepared)

    def seed(self, s: Session) -> None:
        """Start the layer and attach trackers to processes that already hold an
        initialized nvidia-uvm fd (-p, host mode: procfs seeding found them)."""
        self.layer.start()
        self._started = True
        s.incidents.subscribe(lambda inc: self.layer.incident(inc.ts_ns, inc.gpu_index))
        uvm: dict[int, list[int]] = {}
        for (pid, fd), (kind, _gpu) in sorted(s.seeded.items()):
            if kind == schema.DEV_UVM:
                uvm.setdefault(pid, []).append(fd)
        for pid, fds in uvm.items():
            self._attach(s, pid, fds, already_running=True)

    def collect(self, s: Session, due: Due) -> None:
        """Attach a tracker to each process whose UVM_INITIALIZE the probes just saw
        (before its fault bytes are handed over: tracked pids' tracepoint CPU faults
        are dropped)."""
        for pid, fd in s.uvm_inits:
            if pid not in s.tracked and pid != os.getpid():
                self._attach(s, pid, [fd], already_running=False)

    def _attach(self, s: Session, pid: int, fds: list[int], already_running: bool) -> None:
        if not os.path.exists(self.layer.devdir + "/nvidia-uvm-tools"):
            self.no_tracker.add(pid)
            return
        if self.layer.attach(pid, already_running=already_running, fds=fds):
            s.tracked.add(pid)
            self.no_tracker.discard(pid)
            comm = procfs.read_info(pid).comm  # alive now: the tools rows' process name
            if comm is not None:
                s.names[pid] = comm
            print(f"gputrace: driver layer: tracker attached to pid {pid}",
                  file=sys.stderr, flush=True)  # fmt: skip
        else:
            self.no_tracker.add(pid)
            why = next((f["error"] for f in reversed(self.layer.failures)
                        if f["pid"] == pid), "unknown")  # fmt: skip
            print(f"gputrace: warning: driver layer: no tracker on pid {pid}: {why}",
                  file=sys.stderr, flush=True)  # fmt: skip

    def drain(self, s: Session, due: Due) -> list[tuple[str, Any]]:
        if due is Due.FINAL:
            return [("driver_stop", None)]
        if self._due.is_set():  # at most one poll waits in the writer's queue
            return []
        self._due.set()
        return [("driver", None)]

    def housekeep(self, s: Session, gone: set[int]) -> None:
        s.tracked -= gone  # a reused pid gets a tracker of its own

    def write(self, s: Session, kind: str, data: Any) -> None:
        """Writer thread: decode what the driver layer drained and append it."""
        self._due.clear()
        fetch = self.layer.stop if kind == "driver_stop" else self.layer.poll
        try:
            tables = fetch()
        except Exception as e:  # a decoder bug loses that drain, not the recording
            first = str(e).splitlines()[0] if str(e) else ""
            s.skip("uvm_tools", 1, f"{type(e).__name__}: {first}")
            return
        for name, parts in tables.items():
            buf = Buffer(name, self.TOOLS.counted_as, self.TOOLS.dtype, _ready)
            for part in parts:
                s.decode(self, buf, name, with_comm(s, part) if name == "faults" else part)
        bad = self.layer.bad_records()
        s.skip("uvm_tools", bad - self._bad, "cut short or unknown codes")
        self._bad = bad

    def manifest(self, s: Session, m: dict[str, Any]) -> dict[str, Any]:
        """Layers, drops, clock and facts of the driver layer; GPU UUIDs into `gpus`."""
        if not self._started:
            return {}
        frag = self.layer.manifest()
        uuids = {g["index"]: g["uuid"] for g in frag["gpu_uuids"]}
        gpus = [{**g, "uuid": uuids[g["index"]]} if g.get("index") in uuids else g
                for g in m.get("gpus", [])]  # fmt: skip
        return {
            "layers": frag["layers"],
            "drops": frag["drops"],
            "clock": frag["clock"],
            "driver_layer": {**frag["driver_layer"], "cpu_fault_source": {
                "uvm_tools_pids": sorted(self.layer.attached_pids()),
                "uvm_pids_without_tracker": sorted(self.no_tracker),
                "tracepoint_rows_dropped": s.cpu_faults_replaced}},
            "gpus": gpus,
        }

    def close(self, s: Session) -> None:
        driver_layer.close_quietly(self.layer)
