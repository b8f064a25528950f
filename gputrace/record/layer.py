"""The recorder layer protocol: what each layer (syscall, cpu_faults, api, driver)
does at each step of a recording, and the buffers it hands the writer thread.

A recording runs each step over the layers in `layers.RECORDER_LAYERS` order:

- `configure`: before any target is started (BPF maps, options);
- `attach`: the targets are known (their pids into maps, uprobes);
- `seed`: state of processes that were running before (fds, managed ranges,
  trackers); the trace's first part is written;
- `collect` (poll thread, every poll): take data in from the kernel or driver;
- `drain` (poll thread): work items `(kind, data)` for the writer thread; a kind
  listed in the layer's `BUFFERS` is decoded there by the Buffer's decoder and
  appended to its table, any other kind goes to the layer's `write`;
- `housekeep` (poll thread, after each rotation's drain): forget exited processes;
- `validate` (before anything starts) and `build` (after the start time is taken:
  loads the layer's programs; None when the layer does not run here);
- `manifest` (writer thread, at each rotation and at the end): a fragment merged
  into the trace manifest;
- `close`: release everything, on every path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    from gputrace.record.session import Session

Batch = pa.RecordBatch | pa.Table
Decoded = tuple[Batch | None, int]
"""A decoder's rows (None when there are none) and the records it skipped as unreadable."""


class Due(Enum):
    """Why the poll thread drains: every poll, a rotation (every second), the end."""

    POLL = "poll"
    ROTATE = "rotate"
    FINAL = "final"


@dataclass(frozen=True)
class Buffer:
    """How the writer thread turns one work item kind into rows.

    counted_as: the `decode_errors` key of records it skips; dtype: the record unit
    (a decoder that raises loses `len(data) // dtype.itemsize` records, at least 1);
    decoder(layer, session, kind, data) -> (rows, skipped); last: items of this kind
    are queued after the others of the same drain (process exits: rows drained
    with their process's exit still find it)."""

    table: str
    counted_as: str
    dtype: np.dtype[Any]
    decoder: Callable[[Any, Session, str, Any], Decoded]
    last: bool = False


class Layer:
    """One layer of the recording. Subclasses override the steps they take part in."""

    name: ClassVar[str] = ""
    trace_layer: ClassVar[str | None] = None
    """The trace layer (`schema.LAYERS`) its buffers write, when not its `name`."""
    builds_first: ClassVar[bool] = False
    """Its `build` only hands probes to another layer's program (`Session.api_extensions`)
    and loads nothing: built before any layer starts loading, so a program loaded
    ahead (record/startup.py) already holds them."""
    BUFFERS: ClassVar[dict[str, Buffer]] = {}
    RECORDS: ClassVar[dict[str, tuple[str, ...]]] = {}
    """The trace layers it can record, each with the `gputrace doctor` checks it needs
    besides those every recording needs (`doctor.REQUIRED`): doctor lists each one whose
    checks pass. Empty: its `trace_layer or name`, needing no more (`records()`)."""

    @classmethod
    def records(cls) -> dict[str, tuple[str, ...]]:
        """The trace layers it can record and the doctor checks each needs."""
        return dict(cls.RECORDS) or {cls.trace_layer or cls.name: ()}

    @classmethod
    def validate(cls, opts: Any, prefix: str) -> Any:
        """Refuse bad options before anything starts; what `build` is given."""
        return None

    @classmethod
    def build(cls, s: Session, prepared: Any) -> Layer | None:
        """The layer for this recording (loads its programs), or None when it
        does not run here."""
        return cls()

    @property
    def hooks(self) -> int:
        """Probes attached (the ready line's count)."""
        return 0

    def configure(self, s: Session) -> None:
        """Before any target is started."""

    def attach(self, s: Session) -> None:
        """The targets are known (`s.targets`)."""

    def seed(self, s: Session) -> None:
        """Processes running before the recording (`s.seeded`)."""

    def collect(self, s: Session, due: Due) -> None:
        """Poll thread: take data in (before any layer drains)."""

    def drain(self, s: Session, due: Due) -> list[tuple[str, Any]]:
        """Poll thread: work items for the writer thread."""
        return []

    def housekeep(self, s: Session, gone: set[int]) -> None:
        """Poll thread, after a rotation's drain: forget the processes in `gone`."""

    def write(self, s: Session, kind: str, data: Any) -> None:
        """Writer thread: an item whose kind is not in BUFFERS."""

    def manifest(self, s: Session, m: dict[str, Any]) -> dict[str, Any]:
        """Writer thread: manifest keys to merge (`m` is the manifest so far). By default
        the trace layers it records, so a layer that says nothing more is listed."""
        return {"layers": list(self.records())}

    def close(self, s: Session) -> None:
        """Release everything (also on error paths; must not raise)."""
