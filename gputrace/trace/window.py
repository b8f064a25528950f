"""The flight recorder's window arithmetic (`record --keep`): what a window is,
which parts fall out of it, and the `window` manifest key that says what a
trace still holds. Pure bookkeeping, no I/O: `gputrace.trace.flight` deletes.

A part is deleted whole, so the window moves by one rotation (ROTATE_S, 1 s)
at a time: a window is at least MIN_KEEP_NS (five rotations) or MIN_KEEP_BYTES.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from gputrace.errors import UsageError
from gputrace.options import DURATION_UNITS, parse_duration_ns, parse_size

MIN_KEEP_NS = 5 * 10**9
"""The shortest time window: five one-second rotations, so a part is at most a
fifth of it (deletion moves the window by that much at a time)."""
MAX_KEEP_NS = 366 * 86400 * 10**9
MIN_KEEP_BYTES = 1 << 20
UNDELETABLE = frozenset({"stacks"})
"""Tables whose rows have no time and are referenced from other tables' rows
(`stack_id`): kept whole; they grow with distinct stacks, not with time."""
TIME_COLUMN = {"processes": "exit_ts_ns"}
"""Tables whose part age is not `ts_ns`: a processes row is written at its
process's exit (rows of processes still running have none: never deleted)."""
_UNIT = re.compile(r"\s*[0-9.eE+-]+\s*([a-zA-Zµ]*)\s*", re.ASCII)


@dataclass(frozen=True)
class Keep:
    """A window: the last `ns` nanoseconds of events, or the newest `bytes` of parts
    (either or both: both keep whichever holds less)."""

    ns: int | None = None
    bytes: int | None = None
    text: str = ""

    def manifest(self) -> dict[str, Any]:
        return {"keep": self.text, "keep_ns": self.ns, "keep_bytes": self.bytes}


def parse_keep(texts: list[str], option: str = "--keep") -> Keep:
    """`--keep 15m` (time: ns, us, ms, s, m, min, h) or `--keep 2GiB` (bytes: B, K,
    KiB, KB, M, MiB, ..., where `m` alone is minutes); given twice, one of each."""
    ns: int | None = None
    size: int | None = None
    for text in texts:
        m = _UNIT.fullmatch(text)
        unit = m.group(1) if m else ""
        if m is not None and not unit:
            raise UsageError(f"{option} {text!r}: give a unit, a time (15m, 1h) or a size "
                             "(2GiB)")
        if unit in DURATION_UNITS:
            if ns is not None:
                raise UsageError(f"{option}: one time window at most")
            ns = parse_duration_ns(text, option, minimum_ns=MIN_KEEP_NS,
                                   maximum_ns=MAX_KEEP_NS)  # fmt: skip
        else:
            if size is not None:
                raise UsageError(f"{option}: one size window at most")
            size = parse_size(text, option, minimum=MIN_KEEP_BYTES)
    if ns is None and size is None:
        raise UsageError(f"{option} needs a time (15m) or a size (2GiB)")
    return Keep(ns, size, " ".join(t.strip() for t in texts))


@dataclass
class Part:
    """One part file as written: its table, name, rows, bytes on disk and the time
    span of its rows (None: rows without a time, never deleted by time)."""

    table: str
    name: str
    rows: int
    bytes: int
    first_ns: int | None
    last_ns: int | None
    raw: bool = False

    @property
    def deletable(self) -> bool:
        return self.table not in UNDELETABLE and self.last_ns is not None


def expired(parts: list[Part], keep: Keep) -> list[Part]:
    """The parts to delete so that what remains is the window `keep`: by time,
    every deletable part whose newest row is older than the newest row of all
    minus `keep.ns`; by size, then the oldest deletable parts (by their newest
    row) until the deletable parts left hold at most `keep.bytes`."""
    doomed: list[Part] = []
    candidates = sorted((p for p in parts if p.deletable), key=lambda p: p.last_ns or 0)
    if not candidates:
        return doomed
    if keep.ns is not None:
        newest = max(p.last_ns or 0 for p in candidates)
        cutoff = newest - keep.ns
        doomed = [p for p in candidates if (p.last_ns or 0) < cutoff]
    if keep.bytes is not None:
        out = {id(p) for p in doomed}
        left = [p for p in candidates if id(p) not in out]
        held = sum(p.bytes for p in left)
        for p in left:
            if held <= keep.bytes:
                break
            doomed.append(p)
            held -= p.bytes
    return doomed


@dataclass
class Held:
    """The parts a flight trace holds and what it deleted: the `window` manifest key."""

    keep: Keep | None
    parts: list[Part] = field(default_factory=list)
    from_ns: int | None = None  # every event from here on is held
    deleted_parts: int = 0
    deleted_rows: int = 0
    deleted_bytes: int = 0
    peak_bytes: int = 0
    bytes: int = 0  # held now (a running sum: a day's window is 10^5 parts)

    def add(self, part: Part) -> None:
        self.parts.append(part)
        self.bytes += part.bytes
        self.peak_bytes = max(self.peak_bytes, self.bytes)

    def expire(self) -> list[Part]:
        """Drop the parts out of the window from the books; the caller deletes them
        once the manifest saying so is written."""
        if self.keep is None:
            return []
        doomed = expired(self.parts, self.keep)
        gone = {id(p) for p in doomed}
        self.parts = [p for p in self.parts if id(p) not in gone]
        for p in doomed:
            self.deleted_parts += 1
            self.deleted_rows += p.rows
            self.deleted_bytes += p.bytes
            self.bytes -= p.bytes
            if p.last_ns is not None:
                self.from_ns = max(self.from_ns or 0, p.last_ns + 1)
        return doomed

    def manifest(self, rotate_s: float) -> dict[str, Any]:
        keep = self.keep.manifest() if self.keep is not None else {}
        return {**keep, "from_ts_ns": self.from_ns,
                "deleted_parts": self.deleted_parts, "deleted_rows": self.deleted_rows,
                "deleted_bytes": self.deleted_bytes, "held_bytes": self.bytes,
                "peak_held_bytes": self.peak_bytes, "rotate_s": rotate_s}  # fmt: skip

    def tables(self) -> dict[str, Any]:
        """The manifest's `tables` over the parts held."""
        out: dict[str, dict[str, int]] = {}
        for p in self.parts:
            t = out.setdefault(p.table, {"rows": 0, "parts": 0})
            if p.raw:
                t["raw_parts"] = t.get("raw_parts", 0) + 1
                t["raw_records"] = t.get("raw_records", 0) + p.rows
            else:
                t["rows"] += p.rows
                t["parts"] += 1
        return out
