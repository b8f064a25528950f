"""The one list of `gputrace analyze` reports, and what each one is.

`REPORTS` is read by everything that enumerates reports: the CLI (`--only` names,
`--fail-on` conditions), the JSON document (one key per report), the terminal
renderer (one section per report, in this order), the HTML, diff and fleet paths
(through `run_reports`), the tests and benchmarks/analyze/bench.py. Adding a report
is one entry here plus its own module; nothing else enumerates reports.

Spellings: `name` is the CLI spelling (`--only fault-rate`, docs/analyses/<name>.md);
`key` is the report's key in the JSON document, a stable contract
(docs/json-report.md): `fault-rate` is `fault_rate` there, and this is the one place
that maps the one to the other.

This module only describes reports: the analyses are imported when a report runs,
so the CLI can read the list without loading polars.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gputrace.analyses.helpers.common import Inputs
    from gputrace.analyses.helpers.partition import Slice
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


class Context:
    """What a report's steps see while `run_reports` runs: the trace's inputs, the
    options, the reports asked for, values shared between reports (`memo`) and the
    per-pid-slice parts (`parts`), computed in one pass for every report that has one."""

    def __init__(self, inp: Inputs, opts: ReportOptions, names: list[str]) -> None:
        self.inp = inp
        self.opts = opts
        self.names = names
        self._memo: dict[str, Any] = {}
        self._parts: dict[str, list[Any]] | None = None

    def memo(self, key: str, make: Callable[[], Any]) -> Any:
        """`make()`, computed once per run under `key`."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    def parts(self, name: str) -> list[Any]:
        """Report `name`'s part of each pid slice. The first call makes one pass over the
        slices for every asked-for report with a `part` step: they share each slice's
        lifetimes."""
        if self._parts is None:
            from gputrace.analyses.helpers.partition import per_slice

            steps: dict[str, Callable[[Slice], Any]] = {}
            for spec in selected(self.names):
                if spec.part is not None:
                    steps[spec.name] = _bind(spec.part, self)
            self._parts = per_slice(self.inp, steps)
        return self._parts[name]


def _bind(part: Callable[[Context, Slice], Any], ctx: Context) -> Callable[[Slice], Any]:
    return lambda sl: part(ctx, sl)


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


# ---- the reports' steps (imports on first use: see the module docstring)


def _leak_options(ctx: Context) -> Any:
    from gputrace.analyses.leaks import LeakOptions

    o = ctx.opts
    return ctx.memo("leak_options", lambda: LeakOptions(o.older_ns, o.min_size, o.top))


def _leaks_part(ctx: Context, sl: Slice) -> Any:
    from gputrace.analyses.leaks import leak_part

    return leak_part(sl, _leak_options(ctx))


def _leaks(ctx: Context) -> Report:
    from gputrace.analyses.leaks import leaks

    return leaks(ctx.inp, _leak_options(ctx), ctx.parts("leaks"))


def _pmm(ctx: Context) -> Any:
    from gputrace.analyses.helpers.gpus import pmm_gpus

    return ctx.memo("pmm_gpus", lambda: pmm_gpus(ctx.inp))


def _summary_part(ctx: Context, sl: Slice) -> Any:
    from gputrace.analyses.summary import summary_part

    return summary_part(sl, _pmm(ctx) is None)


def _summary(ctx: Context) -> Report:
    from gputrace.analyses.summary import summary

    return summary(ctx.inp, ctx.parts("summary"), _pmm(ctx))


def _fault_rate(ctx: Context) -> Report:
    from gputrace.analyses.fault_rate import fault_rate

    o = ctx.opts
    return fault_rate(ctx.inp, window_s=o.window_s, min_reversals=o.thrash_min, top=o.top)


def _fragmentation(ctx: Context) -> Report:
    from gputrace.analyses.fragmentation import fragmentation

    return fragmentation(ctx.inp)


# ---- the reports' --fail-on conditions


def _leaks_hit(rep: dict[str, Any], _: float) -> str | None:
    n = rep["total_count"]
    return f"leaks: {n} leaked allocations ({rep['total_bytes']} bytes)" if n else None


def _growth_hit(rep: dict[str, Any], _: float) -> str | None:
    pids = rep["growing_pids"]
    return f"growth: memory climbing in pid(s) {pids}" if pids else None


def _thrashing_hit(rep: dict[str, Any], _: float) -> str | None:
    blocks = (rep.get("thrashing") or {}).get("blocks")
    return f"thrashing: {len(blocks)} block-windows" if blocks else None


def _thrashing_blind(rep: dict[str, Any]) -> str | None:
    return "thrashing (layer driver not recorded)" if rep.get("thrashing") is None else None


def _fragmentation_hit(rep: dict[str, Any], x: float) -> str | None:
    # PMM chunks (driver layer) and RM samples (rm_query): either may be absent
    worst = max([*(s[at]["fragmentation_index"] or 0.0 for s in rep["gpus"] or []
                   for at in ("peak", "end") if s.get(at)),
                 *(g["worst"]["unusable_share"] or 0.0
                   for g in (rep.get("rm") or {}).get("gpus", []))], default=0.0)
    return f"fragmentation: index {worst:.3f} > {x}" if worst > x else None


REPORTS: list[ReportSpec] = [
    ReportSpec("leaks", "leaks", "Leaks", ("api", "syscall"), _leaks, _leaks_part,
               (Gate("leaks", _leaks_hit), Gate("growth", _growth_hit))),
    ReportSpec("fault-rate", "fault_rate", "Fault rate", ("cpu_faults", "driver", "uvm_tools"),
               _fault_rate, gates=(Gate("thrashing", _thrashing_hit, blind=_thrashing_blind),)),
    ReportSpec("fragmentation", "fragmentation", "Fragmentation", ("driver", "rm_query"),
               _fragmentation, gates=(Gate("fragmentation", _fragmentation_hit, threshold=True),)),
    ReportSpec("summary", "summary", "Summary", ("api", "driver", "syscall"), _summary,
               _summary_part, prepare=_pmm),
]
"""Every report, in the order the CLI, JSON document and terminal list them."""


def names() -> list[str]:
    """The CLI names of every report, in order."""
    return [s.name for s in REPORTS]


def selected(wanted: list[str]) -> list[ReportSpec]:
    """The reports named in `wanted` (CLI names), in registry order."""
    return [s for s in REPORTS if s.name in wanted]


def gate_report(gate: str) -> ReportSpec:
    """The report a `--fail-on` condition reads."""
    return next(s for s in REPORTS if any(g.name == gate for g in s.gates))


def gates() -> list[Gate]:
    """Every `--fail-on` condition, in registry order."""
    return [g for s in REPORTS for g in s.gates]
