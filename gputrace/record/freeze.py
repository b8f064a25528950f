"""`record --keep` and `--freeze-on`: the flight recorder's options, and the
observer that turns what is decoded into incidents the flight writer freezes
(`gputrace.trace.flight`). docs/flight-recorder.md."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa

from gputrace import identity
from gputrace.errors import UsageError
from gputrace.identity import Identity
from gputrace.record import incidents
from gputrace.trace.flight import FlightWriter
from gputrace.trace.window import Keep

TRIGGERS = ("oom", "alert")
AFTER_NS = 30 * 10**9
"""What an incident keeps after it fires, by default (`--after`)."""


@dataclass(frozen=True)
class Flight:
    """The flight recorder's settings (None / empty: a plain recording)."""

    keep: Keep | None = None
    freeze_on: frozenset[str] = frozenset()
    after_ns: int = AFTER_NS

    @property
    def wanted(self) -> bool:
        return self.keep is not None or bool(self.freeze_on)


def parse_triggers(text: str) -> frozenset[str]:
    """`--freeze-on oom[,alert]`."""
    got = [t.strip() for t in text.split(",")]
    bad = [t for t in got if t not in TRIGGERS]
    if bad or not got:
        raise UsageError(f"--freeze-on: {bad[0] if bad else text!r} is not a trigger "
                         f"(one or more of {', '.join(TRIGGERS)}, comma-separated)")  # fmt: skip
    return frozenset(got)


def _made(o: incidents.Incident) -> int:
    """When the failing call was made (its row's time), else when it returned."""
    return o.start_ns if o.start_ns is not None else o.ts_ns


class Freezer:
    """An observer (writer thread): an allocation refused for want of memory
    freezes an incident (`oom`), with the verdict of the latest GPU memory sample
    in its details (and, given `who`, the failing process's container and pod:
    gputrace.identity); `alert` freezes one per alert fired."""

    def __init__(self, flight: Flight, writer: Callable[[], Any],
                 who: Callable[[int], Identity | None] | None = None) -> None:
        self.flight = flight
        self._writer = writer
        self.who = who
        self.samples: dict[int, dict[str, Any]] = {}  # gpu -> latest gpu_memory row

    def observe(self, table: str, rows: pa.Table) -> None:
        if table == "gpu_memory":
            for r in rows.to_pylist():
                if r["status"] == 0 and r["gpu_index"] is not None:
                    self.samples[int(r["gpu_index"])] = r
            return
        if "oom" not in self.flight.freeze_on:
            return
        found = incidents.incidents(table, rows)
        for o in sorted(found, key=_made):
            g = o.gpu_index
            if g is None and len(self.samples) == 1:
                g = next(iter(self.samples))
            sample = self.samples.get(g) if g is not None else None
            # the incident is when the failing call was made (the trace's row time)
            self.fire("oom", _made(o), {
                "layer": o.layer, "call": o.call, "pid": o.pid, "comm": o.comm,
                "requested_bytes": o.size_bytes, "gpu_index": g,
                "verdict": incidents.verdict(o.size_bytes, sample),
                "free_bytes": None if sample is None else sample["heap_free_bytes"],
                "largest_free_bytes": None if sample is None else sample["largest_free_bytes"],
                "heap_bytes": None if sample is None else sample["heap_size_bytes"],
                **({} if self.who is None else asdict(self.who(o.pid) or identity.NONE)),
            })  # fmt: skip

    def fire(self, trigger: str, ts_ns: int, detail: dict[str, Any]) -> None:
        w = self._writer()
        if trigger in self.flight.freeze_on and isinstance(w, FlightWriter):
            w.freeze(trigger, ts_ns, self.flight.after_ns, detail)
