"""The one list of `gputrace analyze` reports, and what each one is.

`REPORTS` is read by everything that enumerates reports: the CLI (`--only` names,
`--fail-on` conditions), the JSON document (one key per report), the terminal
renderer (one section per report, in this order), the HTML, diff and fleet paths
(through `run_reports`), the tests and benchmarks/analyze/bench.py. Adding a report
is one entry here plus its own module; nothing else enumerates reports.

Spellings: `name` is the CLI spelling (`--only fault-rate`, docs/analyses/<name>.md);
`key` is the report's key in the JSON document, a stable contract (docs/json-report.md):
`fault-rate` is `fault_rate` there; this is the one place that maps one to the other.

What a report is (`ReportSpec`, `Gate`, `ReportOptions`) is in report_spec, the
`--fail-on` conditions in fail_on. The analyses are imported when a report runs, so
the CLI can read the list without loading polars.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gputrace.analyses import fail_on
from gputrace.analyses.report_spec import Gate, ReportOptions, ReportSpec

if TYPE_CHECKING:
    from gputrace.analyses.helpers.inputs import Inputs
    from gputrace.analyses.helpers.partition import Slice
    from gputrace.analyses.report import Report


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

            steps: dict[str, Callable[[Slice], Any]] = {
                s.name: functools.partial(s.part, self)
                for s in selected(self.names) if s.part is not None}
            self._parts = per_slice(self.inp, steps)
        return self._parts[name]


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


def _tensors(ctx: Context) -> Report:
    from gputrace.analyses.allocator_tensors import tensors

    return tensors(ctx.inp, ctx.opts.top)


def _allocator_pool(ctx: Context) -> Report:
    from gputrace.analyses.allocator_pool import pool

    return pool(ctx.inp, ctx.opts.top)


def _allocator_growth(ctx: Context) -> Report:
    from gputrace.analyses.allocator_growth import growth

    return growth(ctx.inp, ctx.opts.top)


REPORTS: list[ReportSpec] = [
    ReportSpec("leaks", "leaks", "Leaks", ("api", "syscall"), _leaks, _leaks_part,
               (Gate("leaks", fail_on.leaks_hit), Gate("growth", fail_on.growth_hit))),
    ReportSpec("fault-rate", "fault_rate", "Fault rate", ("cpu_faults", "driver", "uvm_tools"),
               _fault_rate, gates=(Gate("thrashing", fail_on.thrashing_hit,
                                        blind=fail_on.thrashing_blind),)),
    ReportSpec("fragmentation", "fragmentation", "Fragmentation", ("driver", "rm_query"),
               _fragmentation,
               gates=(Gate("fragmentation", fail_on.fragmentation_hit, threshold=True),)),
    ReportSpec("summary", "summary", "Summary", ("api", "driver", "syscall"), _summary,
               _summary_part, prepare=_pmm),
    ReportSpec("tensors", "tensors", "Tensors alive (PyTorch)", ("allocator",), _tensors),
    ReportSpec("allocator-pool", "allocator_pool", "PyTorch allocator pool", ("allocator",),
               _allocator_pool),
    ReportSpec("allocator-growth", "allocator_growth", "PyTorch allocator growth",
               ("allocator",), _allocator_growth),
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
