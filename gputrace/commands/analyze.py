"""`gputrace analyze`: reports over a saved trace (no root, no GPU)."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from gputrace.analyses.common import Inputs, inputs_from_trace, trace_warnings
from gputrace.analyses.report import REPORT_KEYS, Report, document
from gputrace.errors import GputraceError, UsageError

FORMATS = ("terminal", "json")
PROGRESS_ROWS = 2_000_000
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 10**6,
          "mib": 1 << 20, "g": 1 << 30, "gb": 10**9, "gib": 1 << 30, "t": 1 << 40,
          "tb": 10**12, "tib": 1 << 40}
_DURATIONS = {"ns": 1, "us": 10**3, "ms": 10**6, "s": 10**9, "": 10**9, "m": 60 * 10**9,
              "min": 60 * 10**9, "h": 3600 * 10**9}


class FindingsTriggered(GputraceError):
    """A `--fail-on` condition held; exit status 3 for CI gates."""

    exit_code = 3


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise UsageError(f"--min-size: cannot read {text!r} (e.g. 4096, 64KiB, 2MiB, 1G)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def parse_duration(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", text)
    if not m or m.group(2) not in _DURATIONS:
        raise UsageError(f"--older: cannot read {text!r} (e.g. 30s, 5m, 1h, 500ms)")
    return int(float(m.group(1)) * _DURATIONS[m.group(2)])


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
        m = re.fullmatch(r"fragmentation\s*>\s*(\d*\.?\d+)", part)
        if m:
            out.append(("fragmentation", float(m.group(1))))
        elif part in ("leaks", "thrashing", "growth"):
            out.append((part, 0.0))
        else:
            raise UsageError(f"--fail-on: cannot read {part!r} "
                             "(leaks, growth, thrashing or fragmentation>X with X in 0..1)")
    return out


GATE_REPORT = {"leaks": "leaks", "growth": "leaks", "thrashing": "fault-rate",
               "fragmentation": "fragmentation"}


def gates(doc: dict[str, Any], conds: list[tuple[str, float]]) -> list[str]:
    """Messages for each --fail-on condition that holds."""
    hits = []
    for name, x in conds:
        rep = doc[REPORT_KEYS[GATE_REPORT[name]]]
        if rep is None or not rep["recorded"]:
            continue
        if name == "leaks":
            n = sum(v or 0 for v in rep["count_by_layer"].values())
            if n:
                hits.append(f"leaks: {n} leaked allocations ({rep['total_bytes']} bytes)")
        elif name == "growth" and rep["growing_pids"]:
            hits.append(f"growth: memory climbing in pid(s) {rep['growing_pids']}")
        elif name == "thrashing" and rep["thrashing"]["blocks"]:
            hits.append(f"thrashing: {len(rep['thrashing']['blocks'])} block-windows")
        elif name == "fragmentation":
            worst = max((s[at]["fragmentation_index"] or 0.0 for s in rep["gpus"]
                         for at in ("peak", "end") if s.get(at)), default=0.0)
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
    steps: dict[str, Callable[[Inputs, Any], dict[str, Any]]] = {}
    if "leaks" in names:
        steps["leaks"] = lambda part, lt: leak_part(part, lt, lopts)
    if "summary" in names:
        steps["summary"] = lambda part, lt: summary_part(part, lt, pmm is None)
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
             "gpu_memory_bytes": list(inp.gpu_memory_bytes)}
    return document(reports, trace_warnings(inp), facts)


def register(app: typer.Typer) -> None:
    @app.command()
    def analyze(
        trace: Annotated[str, typer.Argument(help="Trace directory.")],
        only: Annotated[str | None, typer.Option(
            "--only", help="Comma-separated reports: leaks,fault-rate,fragmentation,summary.")
        ] = None,
        fmt: Annotated[str, typer.Option("--format", "-f", help="terminal or json.")] = (
            "terminal"),
        output: Annotated[str | None, typer.Option("--output", "-o", help="Write to FILE.")
                          ] = None,
        fail_on: Annotated[str | None, typer.Option(
            "--fail-on", help="Exit 3 when: leaks, growth, thrashing, fragmentation>X.")
        ] = None,
        older: Annotated[str | None, typer.Option(
            "--older", help="Leaks older than DURATION only (30s, 5m, 1h).")] = None,
        min_size: Annotated[str | None, typer.Option(
            "--min-size", help="Leaks of at least BYTES only (4096, 2MiB).")] = None,
        top: Annotated[int | None, typer.Option("--top", help="At most N rows per list.")
                       ] = None,
        window: Annotated[float, typer.Option("--window", help="Fault-rate window, s.")] = 1.0,
        thrash_min: Annotated[int, typer.Option(
            "--thrash-min", help="Reversals per window that make a block thrash.")] = 3,
    ) -> None:
        """Leak, fault-rate, fragmentation and summary reports."""
        from gputrace.tracedir import open_trace

        if fmt not in FORMATS:
            raise UsageError(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}")
        if top is not None and top < 0:
            raise UsageError("--top must be >= 0")
        if window <= 0 or thrash_min < 1:
            raise UsageError("--window must be > 0 and --thrash-min >= 1")
        names = parse_only(only)
        conds = parse_fail_on(fail_on)
        for name, _ in conds:
            if GATE_REPORT[name] not in names:
                raise UsageError(f"--fail-on {name} needs the {GATE_REPORT[name]} report; "
                                 "add it to --only")
        opts = {"older_ns": parse_duration(older) if older else 0,
                "min_size": parse_size(min_size) if min_size else 0, "top": top,
                "window_s": window, "thrash_min": thrash_min}
        t = open_trace(trace)
        inp = inputs_from_trace(t)
        big = sum(t.rows(n) for n in ("ioctls", "cuda_calls", "faults", "chunks",
                                      "migrations", "mappings")) >= PROGRESS_ROWS
        doc = _with_progress(inp, names, opts, big and sys.stderr.isatty())
        _emit(doc, fmt, output, top)
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


def _emit(doc: dict[str, Any], fmt: str, output: str | None, top: int | None) -> None:
    from gputrace.render.json import render_json
    from gputrace.render.terminal import render_terminal

    if output:
        try:
            with Path(output).open("w", encoding="utf-8") as f:
                if fmt == "json":
                    f.write(render_json(doc))
                else:
                    render_terminal(doc, f, color=False, top=top)
        except OSError as e:
            raise GputraceError(f"cannot write {output}: {e.strerror or e}") from None
    elif fmt == "json":
        sys.stdout.write(render_json(doc))
    else:
        render_terminal(doc, sys.stdout, color=sys.stdout.isatty(), top=top)
