"""The one list of `gputrace analyze` reports, and what each one is.

A report declares itself: its module (`gputrace/analyses/<name>.py`, or a package's
`__init__`, or a module of a package of reports such as `allocator/`) holds `SPEC`, its
`ReportSpec`, and the steps it names. `REPORTS` is every `SPEC` found in the modules of
`gputrace.analyses`, sorted by `ReportSpec.place`, made on first use (the modules import
this one for `spec` and `unrecorded`, so the list cannot be made while they load).
Adding a report is its module; nothing else lists reports.

`REPORTS` is read by everything that enumerates reports: the CLI (`--only` names,
`--fail-on` conditions), the JSON document (one key per report), the "not recorded"
report (`unrecorded`, from each entry's layers), the terminal and HTML renderers (each
entry's sections, or the generic one), `gputrace diff` (each entry's tables), `fleet
analyze` (what each entry aggregates, or why not), the docs' generated tables
(catalog), the tests and benchmarks/analyze/bench.py.

Spellings: `name` is the CLI spelling (`--only fault-rate`, docs/analyses/<name>.md);
`key` is the report's key in the JSON document, a stable contract (docs/json-report.md):
`fault-rate` is `fault_rate` there; each entry maps one to the other.

What a report is (`ReportSpec`, `Gate`, `ReportOptions`) is in report_spec, the
`--fail-on` conditions in fail_on.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

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


def discover() -> list[ReportSpec]:
    """Every report: the `SPEC` of each module of `gputrace.analyses` (packages walked
    into), by place, then name. Two reports of one name or key are refused."""
    import gputrace.analyses as package

    found: dict[int, ReportSpec] = {}
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        entry = getattr(importlib.import_module(info.name), "SPEC", None)
        if isinstance(entry, ReportSpec):
            found[id(entry)] = entry  # a module that imports another's SPEC: one entry
    out = sorted(found.values(), key=lambda s: (s.place, s.name))
    for attr in ("name", "key"):
        seen = [getattr(s, attr) for s in out]
        twice = sorted({v for v in seen if seen.count(v) > 1})
        assert not twice, f"two reports of {attr} {twice}"
    return out


def __getattr__(name: str) -> list[ReportSpec]:
    """`REPORTS`, made by `discover` on first use and kept (then a plain module global,
    which tests may append a report to)."""
    if name != "REPORTS":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    reports = discover()
    globals()["REPORTS"] = reports
    return reports


if TYPE_CHECKING:
    REPORTS: list[ReportSpec]
    """Every report, in the order the CLI, JSON document, terminal, HTML page, diff and
    fleet documents list them."""


def _reports() -> list[ReportSpec]:
    reports: list[ReportSpec] = (globals()["REPORTS"] if "REPORTS" in globals()
                                 else __getattr__("REPORTS"))
    return reports


def spec(name: str) -> ReportSpec:
    """The entry of the report whose CLI name is `name`."""
    return next(s for s in _reports() if s.name == name)


def unrecorded(entry: ReportSpec, inp: Inputs, warnings: list[str]) -> Report | None:
    """The report of `entry` when the trace holds none of its layers (None when it holds
    one, or the report reads none): the one place that says "not recorded"."""
    from gputrace.analyses.report import not_recorded

    if not entry.layers or any(inp.has(layer) for layer in entry.layers):
        return None
    return not_recorded(entry.name, entry.question, list(entry.layers), warnings,
                        dict(entry.unrecorded_data))


def names() -> list[str]:
    """The CLI names of every report, in order."""
    return [s.name for s in _reports()]


def selected(wanted: list[str]) -> list[ReportSpec]:
    """The reports named in `wanted` (CLI names), in registry order."""
    return [s for s in _reports() if s.name in wanted]


def report(name: str) -> ReportSpec:
    """The report of CLI name `name`."""
    return next(s for s in _reports() if s.name == name)


def gate_report(gate: str) -> ReportSpec:
    """The report a `--fail-on` condition reads."""
    return next(s for s in _reports() if any(g.name == gate for g in s.gates))


def gates() -> list[Gate]:
    """Every `--fail-on` condition, in registry order."""
    return [g for s in _reports() for g in s.gates]
