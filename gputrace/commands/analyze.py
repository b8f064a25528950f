"""`gputrace analyze`: reports over a saved trace (no root, no GPU)."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from gputrace.analyses.common import NS_PER_S, Inputs, inputs_from_trace, trace_warnings
from gputrace.analyses.gpus import memory_bytes_by_index
from gputrace.analyses.report import REPORT_KEYS, Report, document
from gputrace.errors import GputraceError, UsageError
from gputrace.options import (
    parse_count,
    parse_duration_ns,
    parse_fraction,
    parse_rows,
    parse_size,
)

FORMATS = ("terminal", "json", "html", "perfetto", "folded")
PROGRESS_ROWS = 2_000_000


class FindingsTriggered(GputraceError):
    """A `--fail-on` condition held; exit status 3 for CI gates."""

    exit_code = 3


def parse_only(text: str | None) -> list[str]:
    if not text:
        return list(REPORT_KEYS)
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in REPORT_KEYS]
    if bad or not names:
        raise UsageError(f"--only: unknown report {', '.join(bad) or repr(text)} "
                         f"(choose from {', '.join(REPORT_KEYS)})")
    return [n for n in REPORT_KEYS if n in names]


def parse_fail_on(text: str | None) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    for part in (p.strip() for p in (text or "").split(",") if p.strip()):
        m = re.fullmatch(r"fragmentation\s*>\s*(.*)", part)
        if m:
            out.append(("fragmentation", parse_fraction(m.group(1), "--fail-on fragmentation>X:"
                                                                    " X")))
        elif part in ("leaks", "thrashing", "growth"):
            out.append((part, 0.0))
        else:
            raise UsageError(f"--fail-on: cannot read {part!r} "
                             "(leaks, growth, thrashing or fragmentation>X with X in 0..1)")
    return out


GATE_REPORT = {"leaks": "leaks", "growth": "leaks", "thrashing": "fault-rate",
               "fragmentation": "fragmentation"}


def unmeasured(doc: dict[str, Any], conds: list[tuple[str, float]]) -> list[str]:
    """Which --fail-on conditions cannot be checked because their layer was not recorded?

    A gate on a layer that is absent would pass whatever the program did, so it
    is a usage error, never a silent pass.
    """
    out = []
    for name, _ in conds:
        rep = doc[REPORT_KEYS[GATE_REPORT[name]]]
        if rep is None:
            continue  # not asked for: refused before any work (see analyze)
        if not rep["recorded"]:
            missing = ", ".join(rep["not_recorded_layers"]) or "needed"
            out.append(f"{name} (layer {missing} not recorded)")
        elif name == "thrashing" and rep.get("thrashing") is None:
            out.append("thrashing (layer driver not recorded)")
    return out


def gates(doc: dict[str, Any], conds: list[tuple[str, float]]) -> list[str]:
    """Messages for each --fail-on condition that holds (those `unmeasured` names never do)."""
    hits = []
    for name, x in conds:
        rep = doc[REPORT_KEYS[GATE_REPORT[name]]]
        if rep is None or not rep["recorded"]:
            continue
        if name == "leaks":
            n = rep["total_count"]
            if n:
                hits.append(f"leaks: {n} leaked allocations ({rep['total_bytes']} bytes)")
        elif name == "growth" and rep["growing_pids"]:
            hits.append(f"growth: memory climbing in pid(s) {rep['growing_pids']}")
        elif name == "thrashing" and (rep.get("thrashing") or {}).get("blocks"):
            hits.append(f"thrashing: {len(rep['thrashing']['blocks'])} block-windows")
        elif name == "fragmentation":
            # PMM chunks (driver layer) and RM samples (rm_query): either may be absent
            worst = max([*(s[at]["fragmentation_index"] or 0.0 for s in rep["gpus"] or []
                           for at in ("peak", "end") if s.get(at)),
                         *(g["worst"]["unusable_share"] or 0.0
                           for g in (rep.get("rm") or {}).get("gpus", []))], default=0.0)
            if worst > x:
                hits.append(f"fragmentation: index {worst:.3f} > {x}")
    return hits


def run_reports(inp: Inputs, names: list[str], opts: dict[str, Any],
                step: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Compute the reports named (CLI names) and return the JSON document."""
    from gputrace.analyses.faults import fault_rate
    from gputrace.analyses.fragmentation import fragmentation
    from gputrace.analyses.gpus import pmm_gpus
    from gputrace.analyses.leaks import LeakOptions, leak_part, leaks
    from gputrace.analyses.partition import per_slice
    from gputrace.analyses.summary import summary, summary_part

    lopts = LeakOptions(opts["older_ns"], opts["min_size"], opts["top"])
    # Leaks and summary share each pid slice's lifetimes: one pass over the slices.
    pmm = pmm_gpus(inp) if "summary" in names else None
    steps: dict[str, Callable[[Any], dict[str, Any]]] = {}
    if "leaks" in names:
        steps["leaks"] = lambda sl: leak_part(sl, lopts)
    if "summary" in names:
        steps["summary"] = lambda sl: summary_part(sl, pmm is None)
    parts: dict[str, list[dict[str, Any]]] = {}
    reports: dict[str, Report | None] = dict.fromkeys(REPORT_KEYS)
    for name in names:
        step(name)
        if name in steps and not parts:
            parts = per_slice(inp, steps)
        if name == "leaks":
            reports[name] = leaks(inp, lopts, parts["leaks"])
        elif name == "summary":
            reports[name] = summary(inp, parts["summary"], pmm)
        elif name == "fault-rate":
            reports[name] = fault_rate(inp, window_s=opts["window_s"],
                                       min_reversals=opts["thrash_min"], top=opts["top"])
        else:
            reports[name] = fragmentation(inp)
    facts = {"status": inp.status, "layers": sorted(inp.layers), "synthetic": inp.synthetic,
             "start_ts_ns": inp.start_ns, "end_ts_ns": inp.end_ns,
             "duration_s": (inp.end_ns - inp.start_ns) / 1e9, "drops": dict(inp.drops),
             "gpu_memory_bytes": memory_bytes_by_index(inp)}
    return document(reports, trace_warnings(inp), facts)


def register(app: typer.Typer) -> None:
    @app.command()
    def analyze(
        trace: Annotated[str, typer.Argument(help="Trace directory.")],
        only: Annotated[str | None, typer.Option(
            "--only", help="Comma-separated reports: leaks,fault-rate,fragmentation,summary.")
        ] = None,
        fmt: Annotated[str, typer.Option(
            "--format", "-f", help="terminal, json, html, perfetto (needs -o) or folded.")] = (
            "terminal"),
        output: Annotated[str | None, typer.Option("--output", "-o", help="Write to FILE.")
                          ] = None,
        fail_on: Annotated[str | None, typer.Option(
            "--fail-on", help="Exit 3 when: leaks, growth, thrashing, fragmentation>X.")
        ] = None,
        older: Annotated[str | None, typer.Option(
            "--older", metavar="DURATION",
            help="Leaks older than DURATION only (30s, 5m, 1h).")] = None,
        min_size: Annotated[str | None, typer.Option(
            "--min-size", metavar="BYTES", help="Leaks of at least BYTES only (4096, 2MiB).")
        ] = None,
        top: Annotated[str | None, typer.Option(
            "--top", metavar="N", help="At most N rows per list.")] = None,
        window: Annotated[str, typer.Option(
            "--window", metavar="DURATION",
            help="Fault-rate window (seconds, or 500ms, 2s; at least 1ns).")] = "1",
        thrash_min: Annotated[str, typer.Option(
            "--thrash-min", metavar="N",
            help="Reversals per window that make a block thrash.")] = "3",
        by_layer: Annotated[bool, typer.Option(
            "--by-layer", help="Leaks per layer (api, rm, uvm apart), not joined.")] = False,
        allocated: Annotated[bool, typer.Option(
            "--allocated", help="--format folded: all allocated bytes, not only leaked.")
        ] = False,
    ) -> None:
        """Leak, fault-rate, fragmentation and summary reports."""
        from gputrace.tracedir import open_trace

        if fmt not in FORMATS:
            raise UsageError(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}")
        if fmt == "perfetto" and not output:
            raise UsageError("--format perfetto writes a binary file: give -o FILE")
        names = parse_only(only)
        conds = parse_fail_on(fail_on)
        for name, _ in conds:
            if GATE_REPORT[name] not in names:
                raise UsageError(f"--fail-on {name} needs the {GATE_REPORT[name]} report; "
                                 "add it to --only")
        top_n = parse_rows(top, "--top") if top is not None else None
        older_ns = parse_duration_ns(older, "--older", minimum_ns=0) if older is not None else 0
        opts = {"older_ns": older_ns,
                "min_size": parse_size(min_size, "--min-size") if min_size is not None else 0,
                "top": top_n,
                "window_s": parse_duration_ns(window, "--window") / NS_PER_S,
                "thrash_min": parse_count(thrash_min, "--thrash-min", minimum=1)}
        t = open_trace(trace)
        inp = inputs_from_trace(t)
        big = sum(t.rows(n) for n in ("ioctls", "cuda_calls", "faults", "chunks",
                                      "migrations", "mappings")) >= PROGRESS_ROWS
        if fmt in ("perfetto", "folded"):
            from gputrace.commands.analyze_files import export

            export(inp, fmt, output, allocated, big and sys.stderr.isatty())
            if not conds:
                return
        doc = _with_progress(inp, names, opts, big and sys.stderr.isatty())
        blind = unmeasured(doc, conds)
        if blind:
            raise UsageError("--fail-on cannot check " + "; ".join(blind)
                             + " in this trace; record that layer or drop the condition")
        if fmt == "html":
            from gputrace.commands.analyze_files import export_html

            export_html(t, inp, doc, output, big and sys.stderr.isatty())
        elif fmt in ("terminal", "json"):
            _emit(doc, fmt, output, top_n, by_layer)
        hits = gates(doc, conds)
        if hits:
            raise FindingsTriggered("--fail-on: " + "; ".join(hits))


def _with_progress(inp: Inputs, names: list[str], opts: dict[str, Any],
                   show: bool) -> dict[str, Any]:
    if not show:
        return run_reports(inp, names, opts)
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as prog:
        task = prog.add_task("reading trace", total=len(names))

        def step(name: str) -> None:
            prog.update(task, description=f"analyzing: {name}", advance=1)

        return run_reports(inp, names, opts, step)


def _emit(doc: dict[str, Any], fmt: str, output: str | None, top: int | None,
          by_layer: bool = False) -> None:
    from gputrace.render.json import render_json
    from gputrace.render.terminal import render_terminal

    if output:
        try:
            with Path(output).open("w", encoding="utf-8") as f:
                if fmt == "json":
                    f.write(render_json(doc))
                else:
                    render_terminal(doc, f, color=False, top=top, by_layer=by_layer)
        except OSError as e:
            raise GputraceError(f"cannot write {output}: {e.strerror or e}") from None
    elif fmt == "json":
        sys.stdout.write(render_json(doc))
    else:
        import shutil

        tty = sys.stdout.isatty()
        render_terminal(doc, sys.stdout, color=tty, top=top, by_layer=by_layer,
                        width=shutil.get_terminal_size().columns if tty else None)
