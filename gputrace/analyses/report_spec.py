"""What is a report, to the registry: its entry (`ReportSpec`), its `--fail-on`
conditions (`Gate`), how `gputrace diff` compares it (`DiffTable`), how `fleet analyze`
aggregates it (`FleetUse`) and the options reports read (`ReportOptions`).

An entry names its renderers' sections as "module:function" strings (`resolve` imports
them when a renderer runs), so the registry is read without loading rich or plotly.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gputrace.analyses.helpers.partition import Slice
    from gputrace.analyses.registry import Context
    from gputrace.analyses.report import Report


GROUPINGS = ("pod", "container")
"""What `analyze --by` groups by: a report holding its figures per group has them under
`by_<grouping>` (the group keys: analyses.helpers.identity.GROUP_KEYS)."""


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
    by: str | None = None
    """Leaks, summary, fault rate: their per-process figures also added up per "pod" or
    "container" (`analyze --by`; helpers/identity.py)."""
    oom_window_s: float = 30.0
    """Out of memory: what grew over this many seconds before each failure."""


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
class DiffTable:
    """One table of `gputrace diff`: the rows at `path` in the report's JSON object (or the
    leaked bytes by call stack, `path == ("@stacks",)`), matched across the two traces by
    `keys` and compared on `fields`; `shown` the fields the tables print (None: all)."""

    name: str
    """Its key in the diff document."""
    title: str
    path: tuple[str, ...]
    keys: tuple[str, ...]
    fields: tuple[str, ...]
    shown: tuple[str, ...] | None = None
    is_bytes: bool = False
    """Its figures are bytes (a `count` field never is)."""
    add_up: bool = True
    """Several rows of one key (pids of one name) are added up; False where they never
    occur and the figures are quantiles, which do not add."""


@dataclass(frozen=True)
class FleetUse:
    """How `gputrace fleet analyze` aggregates a report over traces: the fleet document
    keys computed from it (`answers`, by gputrace/fleet/reports.py), the numeric fields
    added up over the traces that recorded it (`sums`, in `report_totals`), or, with
    neither, why it is not aggregated (listed in `not_aggregated`)."""

    answers: tuple[str, ...] = ()
    sums: tuple[str, ...] = ()
    why_not: str = "no fleet aggregation declared"


@dataclass(frozen=True)
class ReportSpec:
    """One report: its spellings, the question it answers, the trace layers it reads (any
    of them: with none recorded it is not recorded, see `registry.unrecorded`), the steps
    that compute it, its `--fail-on` conditions, and how each output shows it."""

    name: str
    key: str
    title: str
    question: str
    layers: tuple[str, ...]
    run: Callable[[Context], Report]
    part: Callable[[Context, Slice], Any] | None = None
    """Its step on each pid slice (shared pass, see `Context.parts`)."""
    gates: tuple[Gate, ...] = ()
    prepare: Callable[[Context], Any] | None = None
    """Run before any report: what its part needs, computed before the slices hold memory."""
    unrecorded_data: Mapping[str, Any] = field(default_factory=dict)
    """Its figures when none of its layers was recorded (absent, never zeros)."""
    terminal: str | None = None
    """Its terminal section, "module:function" (None: the generic one)."""
    terminal_by_layer: str | None = None
    """Its section under `analyze --by-layer` (None: `terminal`)."""
    html: tuple[str, ...] = ()
    """Its HTML sections, "module:function", in page order (none: the generic one)."""
    diff: tuple[DiffTable, ...] | None = None
    """How `gputrace diff` compares it: its tables; None: every numeric figure at its top
    level; (): not compared (listed as such in the diff document)."""
    fleet: FleetUse = FleetUse()
    columns: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """The generic sections' columns (terminal and HTML, for a report with no section of
    its own, and the `by_pod`/`by_container` lists of any report): for each list of rows
    in its JSON object, by key, the columns shown, in order. A list not named here shows
    its columns in name order. Never the rows' own key order, which differs between the
    report as computed (the CLI) and after a JSON round trip (keys sorted)."""
    place: int = 1000
    """Where it stands in every list of reports (the CLI, the JSON document, the terminal,
    the HTML page, diff and fleet documents, the docs): by place, then name."""

    def columns_of(self, key: str, rows: Sequence[Mapping[str, Any]]) -> list[str]:
        """The columns a generic section shows for the list of rows `key`."""
        declared = self.columns.get(key)
        if declared is not None:
            return list(declared)
        return sorted({c for r in rows for c in r})


def resolve(path: str) -> Callable[..., Any]:
    """The function a registry entry names as "module:function"."""
    module, _, name = path.partition(":")
    fn: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return fn
