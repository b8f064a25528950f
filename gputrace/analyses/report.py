"""Report objects: what an analysis found, ready for any renderer.

A report holds JSON-ready data only (dicts, lists, numbers, strings), so
renderers format and never compute. A report whose input layers were not
recorded has `recorded = False` and names the missing layers; its figures
are absent, never zeros. The list of reports, and the JSON key of each, is
gputrace/analyses/registry.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

REPORT_FIELDS = ("question", "recorded", "not_recorded_layers", "warnings")
"""The keys `Report.to_json` adds to every report's figures."""


@dataclass
class Report:
    """One report: its findings, whether it could be measured, and its warnings."""

    name: str
    question: str
    recorded: bool
    data: dict[str, Any] = field(default_factory=dict)
    missing_layers: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.data)
        out["question"] = self.question
        out["recorded"] = self.recorded
        out["not_recorded_layers"] = sorted(self.missing_layers)
        out["warnings"] = list(self.warnings)
        return out


def not_recorded(name: str, question: str, missing: list[str], warnings: list[str],
                 data: dict[str, Any] | None = None) -> Report:
    """The report of an analysis whose layers are absent from the trace."""
    notes = [f"{name}: layer(s) {', '.join(sorted(missing))} not recorded in this trace; "
             "nothing was measured", *warnings]
    return Report(name, question, False, data or {}, sorted(missing), notes)

