"""The syscall layer: the tracepoint program (device fds, ioctls, mappings,
process lifecycle) and its ring buffers (docs/record.md)."""

from __future__ import annotations

import os
import sys
import time
from typing import Any, ClassVar

import numpy as np

from gputrace import schema
from gputrace.record import decode, loader
from gputrace.record.layer import Buffer, Decoded, Due, Layer
from gputrace.record.oom_watch import OomWatch
from gputrace.record.session import Session

DECODE_BYTES = 8 << 20  # hand ioctl events to the writer thread every ~50k
PID_MAX = 1 << 22  # PID_MAX_LIMIT: no kernel hands out larger pids
# code fields of each event struct and the names the decoders give them
MAPPING_CODES = {"op": schema.MAPPING_OPS, "device": schema.DEVICE_KINDS}
FD_CODES = {"op": schema.FD_OPS, "device": schema.DEVICE_KINDS}
OWN = ("ioctl_events", "mapping_events", "fd_events", "proc_events")
RAW_KIND = "raw_ioctls"  # --raw: ioctl records for the writer to store undecoded
# Events arriving faster than `spill_bytes` a second (32 MiB/s: ~200 k ioctls/s), as
# measured over RATE_WINDOW_S, are written raw for at least FAST_HOLD_S: decoding them
# as they come would cost the recorder more than the rings can wait (the decoded
# recorder dropped 11 % at 1.35 M/s with two storms; written raw, 0 at 2.5 M/s)
RATE_WINDOW_S = 0.2
FAST_HOLD_S = 1.0


def _ioctls(_layer: Any, _s: Session, kind: str, data: bytes) -> Decoded:
    ev, bad = (decode.records(data, decode.IOCTL_DTYPE) if kind == "ioctl_events"
               else decode.batched(data, decode.IOCTL_DTYPE, decode.STAGE_EVENTS))  # fmt: skip
    rows, unknown = decode.ioctl_rows(ev)
    return rows, bad + unknown


def _simple(dtype: np.dtype[Any], codes: dict[str, dict[int, str]], batch_fn: Any) -> Any:
    def dec(_layer: Any, _s: Session, _kind: str, data: bytes) -> Decoded:
        ev, bad = decode.records(data, dtype)
        ev, unknown = decode.known(ev, codes)
        return (batch_fn(ev) if len(ev) else None), bad + unknown

    return dec


def _procs(_layer: Any, s: Session, _kind: str, data: bytes) -> Decoded:
    """Process events update the recorder's process list; the processes table
    gets its rows at each exit and at the end (Session.proc_events)."""
    ev, bad = decode.records(data, decode.PROC_DTYPE)
    # the processes table holds int32 pids and int64 times
    ok = ((ev["pid"] <= PID_MAX) & (ev["ppid"] <= PID_MAX) & (ev["tid"] <= PID_MAX)
          & (ev["ts_ns"] < np.uint64(1 << 63)))  # fmt: skip
    s.skip("proc_events", bad + len(ev) - int(np.count_nonzero(ok)),
           "cut short or impossible pid/time")  # fmt: skip
    s.proc_events(ev if ok.all() else ev[ok])
    return None, 0


class SyscallLayer(Layer):
    name = "syscall"
    BUFFERS: ClassVar[dict[str, Buffer]] = {
        "ioctl_events": Buffer("ioctls", "ioctl_events", decode.IOCTL_DTYPE, _ioctls),
        "leftover": Buffer("ioctls", "ioctl_events", decode.IOCTL_DTYPE, _ioctls),
        "mapping_events": Buffer("mappings", "mapping_events", decode.MAPPING_DTYPE,
                                 _simple(decode.MAPPING_DTYPE, MAPPING_CODES,
                                         lambda ev: decode.mappings_batch(ev))),
        "fd_events": Buffer("files", "fd_events", decode.FD_DTYPE,
                            _simple(decode.FD_DTYPE, FD_CODES, lambda ev: decode.files_batch(ev))),
        "proc_events": Buffer("processes", "proc_events", decode.PROC_DTYPE, _procs, last=True),
    }

    def __init__(self, probes: loader.Probes | None = None) -> None:
        self.probes = probes
        self.drops = dict.fromkeys(loader.BUFFERS, 0)
        self.spilled = 0  # ioctl work items written raw (--raw, or the writer behind)
        # the ioctl rate: bytes received at the start of the window, its start, and
        # until when events are written raw for having come too fast
        self._rate = (0, time.monotonic())
        self._fast_until = 0.0
        self.oom: OomWatch | None = None
        self.oom_error: str | None = None

    @classmethod
    def build(cls, s: Session, prepared: Any) -> SyscallLayer:
        source, flags = s.program
        layer = cls(loader.Probes(source, flags))
        s.probes = layer.probes
        return layer

    @property
    def p(self) -> loader.Probes:
        assert self.probes is not None
        return self.probes

    @property
    def hooks(self) -> int:
        return self.p.attached

    def configure(self, s: Session) -> None:
        self.p.configure(self_tgid=os.getpid(), filter_targets=s.filtered, prefix=s.prefix)
        self.p.set_uvm_layouts(s.drv)

    def attach(self, s: Session) -> None:
        self.p.add_targets(s.targets)
        try:  # before the targets run: their first failure is heard at once
            self.oom = OomWatch(self.p.bpf, s.incidents)
        except Exception as e:  # the decoded rows still deliver every failure, later
            self.oom_error = f"{type(e).__name__}: {e}"
            print(f"gputrace: warning: out-of-memory failures are noticed at decode time "
                  f"only ({self.oom_error})", file=sys.stderr, flush=True)  # fmt: skip

    def seed(self, s: Session) -> None:
        self.p.seed_fds(s.seeded)
        if s.seeded:  # fds open before recording: "seen" rows at the start time
            comms = {p: i.comm for p, i in s.procs.items()}
            s.append("files", decode.files_batch(decode.seen_events(s.seeded, s.start_ns, comms)))

    def collect(self, s: Session, due: Due) -> None:
        if due is not Due.POLL:
            self.p.flush_staging()
        self.p.consume()
        now, got = time.monotonic(), self.p.received("ioctl_events")
        if now - self._rate[1] >= RATE_WINDOW_S:
            if (got - self._rate[0]) / (now - self._rate[1]) >= s.spill_bytes:
                self._fast_until = now + FAST_HOLD_S
            self._rate = (got, now)
        # (pid, uvm fd) of UVM_INITIALIZEs: trackers attach before the bytes are decoded
        s.uvm_inits += self.p.uvm_inits
        self.p.uvm_inits.clear()

    def drain(self, s: Session, due: Due) -> list[tuple[str, Any]]:
        if due is Due.POLL and self.p.pending_bytes("ioctl_events") < DECODE_BYTES:
            return []
        items = [(name, raw) for name in OWN if (raw := self.p.take(name))]
        if due is not Due.POLL:
            self.drops = self.p.drops()
        if due is Due.FINAL:
            items.append(("leftover", self.p.leftover_staging()))
        if s.behind() or time.monotonic() < self._fast_until:
            undecoded = [self._raw_item(s, kind, data) for kind, data in items]
            self.spilled += sum(k != u for (k, _), (u, _) in zip(items, undecoded, strict=True))
            items = undecoded
        return items

    @staticmethod
    def _raw_item(s: Session, kind: str, data: bytes) -> tuple[str, bytes]:
        """With --raw, ioctl events go to the writer as bare records (the staged
        leftovers without their batch headers); other kinds are unchanged."""
        if kind == "leftover":
            ev, bad = decode.batched(data, decode.IOCTL_DTYPE, decode.STAGE_EVENTS)
            s.skip("ioctl_events", bad, "cut short")
            return RAW_KIND, ev.tobytes()
        return (RAW_KIND, data) if kind == "ioctl_events" else (kind, data)

    def write(self, s: Session, kind: str, data: Any) -> None:
        if kind == RAW_KIND:
            s.append_raw("ioctl_event", data)

    def housekeep(self, s: Session, gone: set[int]) -> None:
        self.p.forget_tgids(gone)

    def manifest(self, s: Session, m: dict[str, Any]) -> dict[str, Any]:
        hooks = getattr(self.probes, "hooks", {}) if self.probes is not None else {}
        frag: dict[str, Any] = {"layers": ["syscall"], "drops": dict(self.drops),
                                "syscall_hooks": hooks,
                                "oom_watch": {"open": self.oom is not None,
                                              "error": self.oom_error,
                                              "failures": s.incidents.count,
                                              "early": s.incidents.early}}  # fmt: skip
        if s.opts.raw or self.spilled:  # recorded undecoded (tables' raw_parts say where)
            frag["raw_tables"] = {"ioctls": "ioctl_event"}
        if self.spilled and not s.opts.raw:
            frag["spilled"] = {"ioctls": self.spilled}
        return frag

    def close(self, s: Session) -> None:
        if self.oom is not None:
            self.oom.close()
            self.oom = None
        if self.probes is not None:
            self.probes.close()

