"""Running the registry's reports over one trace: the JSON document, and the
`--fail-on` conditions checked against it. `gputrace analyze`, `diff` and the fleet
tasks all run reports through `run_reports`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gputrace.analyses import registry
from gputrace.analyses.registry import Context
from gputrace.analyses.report_spec import ReportOptions

if TYPE_CHECKING:
    from gputrace.analyses.helpers.inputs import Inputs
    from gputrace.analyses.report import Report


def document(reports: dict[str, Report | None], warnings: list[str],
             trace: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON document: one key per registered report (null when not asked for),
    warnings, and `trace` (facts about the trace analyzed). `reports` by CLI name."""
    out: dict[str, Any] = {s.key: None for s in registry.REPORTS}
    out["trace"] = trace or {}
    for spec in registry.REPORTS:
        rep = reports.get(spec.name)
        out[spec.key] = rep.to_json() if rep is not None else None
    out["warnings"] = list(warnings)
    return out


def run_reports(inp: Inputs, names: list[str] | None = None,
                opts: ReportOptions | None = None,
                step: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Compute the reports named (CLI names; None: all) and return the JSON document.
    `step(name)` is called as each report starts (a progress display)."""
    from gputrace.analyses.helpers.gpus import memory_bytes_by_index
    from gputrace.analyses.helpers.inputs import trace_warnings

    specs = registry.selected(registry.names() if names is None else names)
    ctx = Context(inp, opts or ReportOptions(), [s.name for s in specs])
    for spec in specs:
        if spec.prepare is not None:
            spec.prepare(ctx)
    reports: dict[str, Report | None] = {}
    for spec in specs:
        step(spec.name)
        # a report none of whose layers is in the trace never runs: it is "not recorded"
        # from its registry entry, whatever its own steps would do
        absent = registry.unrecorded(spec, inp, trace_warnings(inp))
        reports[spec.name] = absent if absent is not None else spec.run(ctx)
    facts = {"status": inp.status, "layers": sorted(inp.layers), "synthetic": inp.synthetic,
             "start_ts_ns": inp.start_ns, "end_ts_ns": inp.end_ns,
             "duration_s": (inp.end_ns - inp.start_ns) / 1e9, "drops": dict(inp.drops),
             "gpu_memory_bytes": memory_bytes_by_index(inp)}
    return document(reports, trace_warnings(inp), facts)


Conditions = list[tuple[str, float]]
"""`--fail-on` conditions: (gate name, threshold; 0.0 when the gate takes none)."""


def not_recorded(doc: dict[str, Any], report: str, layers: tuple[str, ...] = ()) -> str | None:
    """The layers missing for report `report` (CLI name) of `doc` to say anything, and
    any of `layers` the trace did not record, as text ("syscall", "api, syscall"); None
    when all were recorded. A gate on an absent layer would pass whatever the program
    did (`analyze --fail-on` and `diff --fail-on` both refuse it)."""
    rep = doc[registry.report(report).key]
    if rep is not None and not rep["recorded"]:
        return ", ".join(rep["not_recorded_layers"]) or "needed"
    have = set(doc.get("trace", {}).get("layers", []))
    lacking = [x for x in layers if x not in have]
    return ", ".join(lacking) or None


def unmeasured(doc: dict[str, Any], conds: Conditions) -> list[str]:
    """Which --fail-on conditions cannot be checked because their layer was not recorded?

    A gate on a layer that is absent would pass whatever the program did, so it
    is a usage error, never a silent pass.
    """
    out = []
    for name, _ in conds:
        spec = registry.gate_report(name)
        rep = doc[spec.key]
        if rep is None:
            continue  # not asked for: refused before any work (see analyze)
        missing = not_recorded(doc, spec.name)
        if missing:
            out.append(f"{name} (layer {missing} not recorded)")
            continue
        gate = next(g for g in spec.gates if g.name == name)
        why = gate.blind(rep) if gate.blind is not None else None
        if why:
            out.append(why)
    return out


def gate_hits(doc: dict[str, Any], conds: Conditions) -> list[str]:
    """Messages for each --fail-on condition that holds (those `unmeasured` names never do)."""
    hits = []
    for name, x in conds:
        spec = registry.gate_report(name)
        rep = doc[spec.key]
        if rep is None or not rep["recorded"]:
            continue
        gate = next(g for g in spec.gates if g.name == name)
        msg = gate.hit(rep, x)
        if msg:
            hits.append(msg)
    return hits
