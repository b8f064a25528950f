"""The cpu_faults layer: CPU page faults on managed memory from the
`exceptions:page_fault_user` hook in the syscall layer's program (docs/record.md)."""

from __future__ import annotations

from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc

from gputrace.record import loader
from gputrace.record.cpu_faults import decode as decode_faults
from gputrace.record.cpu_faults import managed_ranges as cpufaults
from gputrace.record.layer import Buffer, Decoded, Due, Layer
from gputrace.record.session import Session
from gputrace.record.syscall.layer import DECODE_BYTES


def _faults(_layer: Any, s: Session, kind: str, data: bytes) -> Decoded:
    """Tracepoint CPU faults, less those of processes with a UVM tools tracker:
    the tools stream is their one CPU-fault source (docs/record.md)."""
    batch, bad = cpufaults.decode_batch(kind, data)
    tracked = list(s.tracked)
    if batch is None or not tracked:
        return batch, bad
    keep = pc.invert(pc.is_in(batch.column("pid"), value_set=pa.array(tracked, pa.int32())))
    kept = batch.filter(pc.fill_null(keep, True))
    s.cpu_faults_replaced += batch.num_rows - kept.num_rows
    return (kept if kept.num_rows else None), bad


class CpuFaultsLayer(Layer):
    name = "cpu_faults"
    BUFFERS: ClassVar[dict[str, Buffer]] = {
        kind: Buffer("faults", "fault_events", decode_faults.FAULT_DTYPE, _faults)
        for kind in ("fault_events", "fault_leftover")
    }

    def __init__(self, probes: loader.Probes | None = None) -> None:
        self.probes = probes
        self.stats: dict[str, int] | None = None

    @classmethod
    def build(cls, s: Session, prepared: Any) -> CpuFaultsLayer | None:
        return cls(s.probes) if s.probes is not None else None

    @property
    def p(self) -> loader.Probes:
        assert self.probes is not None
        return self.probes

    def seed(self, s: Session) -> None:
        pids = sorted({*s.targets, *(p for p, _ in s.seeded)})
        self.p.seed_managed(cpufaults.seed(pids, s.prefix))

    def drain(self, s: Session, due: Due) -> list[tuple[str, Any]]:
        if due is Due.POLL and self.p.pending_bytes("fault_events") < DECODE_BYTES:
            return []
        raw = self.p.take("fault_events")
        items: list[tuple[str, Any]] = [("fault_events", raw)] if raw else []
        if due is Due.FINAL:
            items.append(("fault_leftover", self.p.leftover_fault_staging()))
            self.stats = self.p.fault_stats()
        return items

    def housekeep(self, s: Session, gone: set[int]) -> None:
        if gone:
            self.p.forget_managed()

    def manifest(self, s: Session, m: dict[str, Any]) -> dict[str, Any]:
        frag: dict[str, Any] = {"layers": cpufaults.layers(s.attach_plan)}
        if self.stats is not None:
            frag["cpu_faults"] = dict(self.stats)
        return frag
