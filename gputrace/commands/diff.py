"""`gputrace diff BEFORE AFTER`: what changed between two traces of the same job."""

from __future__ import annotations

import re
import sys
from dataclasses import replace
from typing import Annotated, Any

import typer

from gputrace.analyses.helpers.sites import SiteFilter
from gputrace.commands.analyze import FindingsTriggered, parse_site_filter
from gputrace.errors import UsageError
from gputrace.options import parse_size

FORMATS = ("terminal", "json", "html")
METRICS = ("leak_bytes", "peak", "ioctl_p99", "fault_rate")
Cond = tuple[str, float, bool]
"""(metric, threshold, is_percent)."""
NEEDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "leak_bytes": ("leaks", ()), "peak": ("summary", ()),
    "ioctl_p99": ("summary", ("syscall",)), "fault_rate": ("fault-rate", ())}
"""What each --fail-on metric reads: a report (CLI name) and the layers besides it needs."""
LAYER_BOUND = ("leak_bytes", "peak")
"""The --fail-on metrics that compare figures measured in the leak layers (api, syscall):
refused when the two traces measured them in different layers."""


def parse_fail_on(text: str | None) -> list[Cond]:
    """`leak_bytes>+10%`, `peak>+1GiB`, `ioctl_p99>+20%`, `fault_rate>+50%`."""
    out: list[Cond] = []
    for part in (p.strip() for p in (text or "").split(",") if p.strip()):
        m = re.fullmatch(r"(\w+)\s*>\s*\+?\s*(\S+?)\s*(%?)", part)
        if m is None or m.group(1) not in METRICS:
            raise UsageError(f"--fail-on: cannot read {part!r} (METRIC>+N% or METRIC>+SIZE, "
                             f"METRIC one of {', '.join(METRICS)})")
        metric, value, pct = m.group(1), m.group(2), bool(m.group(3))
        if pct:
            try:
                x = float(value)
            except ValueError:
                raise UsageError(f"--fail-on: {value!r} is not a percentage") from None
            if not x >= 0:
                raise UsageError(f"--fail-on: {value!r} is not a percentage")
            out.append((metric, x, True))
        elif metric in ("leak_bytes", "peak"):
            out.append((metric, float(parse_size(value, f"--fail-on {metric}")), False))
        else:
            raise UsageError(f"--fail-on {metric}: give a percentage (e.g. {metric}>+20%)")
    return out


def _over(delta: float, pct: float | None, x: float, is_pct: bool) -> bool:
    if delta <= 0:
        return False
    if not is_pct:
        return delta > x
    return pct is None or pct > x  # from zero to anything is an unbounded rise


def gates(d: dict[str, Any], conds: list[Cond]) -> list[str]:
    """Messages for each --fail-on condition that holds."""
    from gputrace.analyses.diff import peak_increase

    hits = []
    for metric, x, is_pct in conds:
        want = f"{x:g}%" if is_pct else f"{int(x)} bytes"
        if metric == "leak_bytes":
            lb = d["leak_bytes"]
            delta = (lb["after"] or 0) - (lb["before"] or 0)
            if _over(delta, lb["delta_pct"], x, is_pct):
                hits.append(f"leak_bytes rose by {delta} bytes (more than +{want})")
        elif metric == "peak":
            best = peak_increase(d)
            if best and _over(best[0], best[1], x, is_pct):
                hits.append(f"peak of {best[2]} rose by {int(best[0])} bytes "
                            f"(more than +{want})")
        else:
            key, field = (("ioctl_latency", "latency_ns_p99") if metric == "ioctl_p99"
                          else ("fault_rates", "mean_per_s"))
            for r in d[key]:
                f = r[field]
                delta = (f["after"] or 0) - (f["before"] or 0)
                if _over(delta, f["delta_pct"], x, True):
                    what = r.get("name") or r.get("source")
                    hits.append(f"{metric} of {what} rose {f['before']} -> {f['after']} "
                                f"(more than +{want})")
    return hits


def unmeasured(docs: dict[str, dict[str, Any]], conds: list[Cond]) -> list[str]:
    """The --fail-on metrics that a trace (`docs`: "before", "after" -> its document)
    cannot measure because it did not record a layer they need (as `analyze` refuses)."""
    from gputrace.analyses.run import not_recorded

    out = []
    for metric in dict.fromkeys(c[0] for c in conds):
        report, layers = NEEDS[metric]
        for which, doc in docs.items():
            missing = not_recorded(doc, report, layers)
            if missing:
                out.append(f"{metric} (layer {missing} not recorded in the {which} trace)")
    return out


def diff_traces(before: str, after: str, conds: list[Cond] | None = None,
                site_filter: SiteFilter | None = None) -> dict[str, Any]:
    """Both traces analyzed with default options (and `site_filter`), then compared;
    UsageError when a --fail-on condition of `conds` cannot be measured in either, or
    compares leaks measured in different layers."""
    from gputrace.analyses.diff import diff
    from gputrace.analyses.helpers.inputs import inputs_from_trace
    from gputrace.analyses.run import run_reports
    from gputrace.analyses.timeseries.stacks_by_bytes import folded_stacks
    from gputrace.trace.reader import open_trace

    docs, stacks = [], []
    for path in (before, after):
        inp = replace(inputs_from_trace(open_trace(path)), site_filter=site_filter)
        docs.append(run_reports(inp))
        stacks.append(folded_stacks(inp))
    blind = unmeasured({"before": docs[0], "after": docs[1]}, conds or [])
    if blind:
        raise UsageError("--fail-on cannot check " + "; ".join(blind)
                         + "; record that layer or drop the condition")
    out = diff(docs[0], docs[1], stacks[0], stacks[1])
    mismatch = out["leak_layers"]["mismatch"]
    refused = [c[0] for c in conds or [] if c[0] in LAYER_BOUND]
    if mismatch and refused:
        raise UsageError(f"--fail-on {', '.join(dict.fromkeys(refused))}: {mismatch}; "
                         "record both runs with the same layers")
    out["before_trace"], out["after_trace"] = before, after
    out["warnings"] = ([mismatch] if mismatch else []) + (
        [f"before: {w}" for w in docs[0]["warnings"]]
        + [f"after: {w}" for w in docs[1]["warnings"]])
    return out


def register(app: typer.Typer) -> None:
    @app.command("diff")
    def diff_cmd(
        before: Annotated[str, typer.Argument(help="Trace directory of the earlier run.")],
        after: Annotated[str, typer.Argument(help="Trace directory of the later run.")],
        fmt: Annotated[str, typer.Option("--format", "-f", help="terminal, json or html.")
                       ] = "terminal",
        output: Annotated[str | None, typer.Option("--output", "-o", help="Write to FILE.")
                          ] = None,
        fail_on: Annotated[str | None, typer.Option(
            "--fail-on", help="Exit 3 when e.g. leak_bytes>+10%, peak>+1GiB, ioctl_p99>+20%, "
                              "fault_rate>+50%.")] = None,
        site_filter: Annotated[str | None, typer.Option(
            "--site-filter", metavar="PATH|PATTERN",
            help="Your own code, when it is a package (as for analyze).")] = None,
    ) -> None:
        """What changed between two traces: leaks, peaks, fault rates, ioctl latency."""
        from gputrace.commands.analyze_files import opened
        from gputrace.render.diff import render_diff_html, render_diff_terminal
        from gputrace.render.json_doc import render_json

        if fmt not in FORMATS:
            raise UsageError(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}")
        conds = parse_fail_on(fail_on)
        d = diff_traces(before, after, conds, parse_site_filter(site_filter))
        with opened(output, False) as f:
            if fmt == "json":
                f.write(render_json(d))
            elif fmt == "html":
                f.write(render_diff_html(d))
            else:
                render_diff_terminal(d, f, color=output is None and sys.stdout.isatty())
        hits = gates(d, conds)
        if hits:
            raise FindingsTriggered("--fail-on: " + "; ".join(hits))
