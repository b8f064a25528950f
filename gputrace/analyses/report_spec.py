"""What is a report, to the registry: its entry (`ReportSpec`), its `--fail-on`
conditions (`Gate`) and the options reports read (`ReportOptions`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gputrace.analyses.helpers.partition import Slice
    from gputrace.analyses.registry import Context
    from gputrace.analyses.report import Report


@dataclass(frozen=True)
class ReportOptions:
    """The options reports read: `gputrace analyze`'s flags, parsed."""

    older_ns: int = 0
    """Leaks: only allocations older than this at the end of the trace."""
    min_size: int = 0
    """Leaks: only allocations of at least this many bytes."""
    top: int | None = None
    """At most this many rows per list (None: all)."""
    window_s: float = 1.0
    """Fault rate: window length in seconds."""
    thrash_min: int = 3
    """Fault rate: reversals per window that make a block thrash."""


@dataclass(frozen=True)
class Gate:
    """A `--fail-on` condition on one report's JSON object: `hit` says why it holds
    (None when it does not); `blind` why it cannot be checked although the report was
    recorded (None when it can). `threshold`: written `name>X`, X in 0..1."""

    name: str
    hit: Callable[[dict[str, Any], float], str | None]
    threshold: bool = False
    blind: Callable[[dict[str, Any]], str | None] | None = None


@dataclass(frozen=True)
class ReportSpec:
    """One report: its spellings, the trace layers it reads (any of them), the steps
    that compute it, and its `--fail-on` conditions."""

    name: str
    key: str
    title: str
    layers: tuple[str, ...]
    run: Callable[[Context], Report]
    part: Callable[[Context, Slice], Any] | None = None
    """Its step on each pid slice (shared pass, see `Context.parts`)."""
    gates: tuple[Gate, ...] = ()
    prepare: Callable[[Context], Any] | None = None
    """Run before any report: what its part needs, computed before the slices hold memory."""
