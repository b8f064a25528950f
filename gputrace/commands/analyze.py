"""`gputrace analyze`: reports over a saved trace (no root, no GPU)."""

from __future__ import annotations

import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gputrace.analyses import registry
from gputrace.analyses.helpers.sites import SiteFilter
from gputrace.analyses.report_spec import GROUPINGS, ReportOptions
from gputrace.errors import GputraceError, UsageError
from gputrace.options import (
    ROWS_HELP,
    TOP_HELP,
    parse_count,
    parse_duration_ns,
    parse_fraction,
    parse_rows,
    parse_size,
)

if TYPE_CHECKING:
    from gputrace.analyses.helpers.inputs import Inputs
    from gputrace.analyses.run import Conditions

FORMATS = ("terminal", "json", "html", "perfetto", "folded")

PROGRESS_ROWS = 2_000_000


class FindingsTriggered(GputraceError):
    """A `--fail-on` condition held; exit status 3 for CI gates."""

    exit_code = 3


def parse_only(text: str | None) -> list[str]:
    known = registry.names()
    if not text:
        return known
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise UsageError(f"--only: unknown report {', '.join(bad) or repr(text)} "
                         f"(choose from {', '.join(known)})")
    return [n for n in known if n in names]


def parse_fail_on(text: str | None) -> Conditions:
    gates = registry.gates()
    out: Conditions = []
    for part in (p.strip() for p in (text or "").split(",") if p.strip()):
        for g in gates:
            m = re.fullmatch(re.escape(g.name) + r"\s*>\s*(.*)", part) if g.threshold else None
            if m:
                out.append((g.name, parse_fraction(m.group(1), f"--fail-on {g.name}>X: X")))
                break
            if not g.threshold and part == g.name:
                out.append((g.name, 0.0))
                break
        else:
            spelled = [g.name + (">X" if g.threshold else "") for g in gates]
            raise UsageError(f"--fail-on: cannot read {part!r} "
                             f"({', '.join(spelled[:-1])} or {spelled[-1]} with X in 0..1)")
    return out


def parse_site_filter(text: str | None) -> SiteFilter | None:
    """`--site-filter`, checked (helpers/sites.py); a one-line usage error if not a path."""
    if text is None:
        return None
    try:
        return SiteFilter.parse(text)
    except ValueError as e:
        raise UsageError(str(e)) from None


def register(app: typer.Typer) -> None:
    @app.command()
    def analyze(
        trace: Annotated[str, typer.Argument(help="Trace directory.")],
        only: Annotated[str | None, typer.Option(
            "--only", help=f"Comma-separated reports: {','.join(registry.names())}.")
        ] = None,
        fmt: Annotated[str, typer.Option(
            "--format", "-f", help="terminal, json, html, perfetto (needs -o) or folded.")] = (
            "terminal"),
        output: Annotated[str | None, typer.Option("--output", "-o", help="Write to FILE.")
                          ] = None,
        fail_on: Annotated[str | None, typer.Option(
            "--fail-on", help="Exit 3 when: " + ", ".join(
                g.name + (">X" if g.threshold else "") for g in registry.gates()) + ".")
        ] = None,
        older: Annotated[str | None, typer.Option(
            "--older", metavar="DURATION",
            help="Leaks older than DURATION only (30s, 5m, 1h).")] = None,
        min_size: Annotated[str | None, typer.Option(
            "--min-size", metavar="BYTES", help="Leaks of at least BYTES only (4096, 2MiB).")
        ] = None,
        top: Annotated[str | None, typer.Option(
            "--top", metavar="N", help=TOP_HELP + " Default: every row.")] = None,
        rows: Annotated[str | None, typer.Option("--rows", metavar="N", help=ROWS_HELP)
                        ] = None,
        window: Annotated[str, typer.Option(
            "--window", metavar="DURATION",
            help="Fault-rate window (seconds, or 500ms, 2s; at least 1ns).")] = "1",
        oom_window: Annotated[str, typer.Option(
            "--oom-window", metavar="DURATION",
            help="Out of memory: show what grew over DURATION before each failure.")
        ] = "30s",
        thrash_min: Annotated[str, typer.Option(
            "--thrash-min", metavar="N",
            help="Reversals per window that make a block thrash.")] = "3",
        by_layer: Annotated[bool, typer.Option(
            "--by-layer", help="Leaks per layer (api, rm, uvm apart), not joined.")] = False,
        allocated: Annotated[bool, typer.Option(
            "--allocated", help="--format folded: all allocated bytes, not only leaked.")
        ] = False,
        by: Annotated[str | None, typer.Option(
            "--by", metavar="pod|container",
            help="Leaks, summary and fault rate also per Kubernetes pod or per container "
                 "(from the processes' cgroups; docs/containers.md).")] = None,
        site_filter: Annotated[str | None, typer.Option(
            "--site-filter", metavar="PATH|PATTERN",
            help="Your own code, when it is a package: frames whose file starts with PATH "
                 "or matches PATTERN (* and ?) name the allocation sites.")] = None,
    ) -> None:
        """The reports of the registry (see --only) over a saved trace."""
        from gputrace.analyses.helpers.common import NS_PER_S
        from gputrace.analyses.helpers.inputs import inputs_from_trace
        from gputrace.analyses.run import gate_hits, unmeasured
        from gputrace.trace.reader import open_trace

        if fmt not in FORMATS:
            raise UsageError(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}")
        if fmt == "perfetto" and not output:
            raise UsageError("--format perfetto writes a binary file: give -o FILE")
        names = parse_only(only)
        conds = parse_fail_on(fail_on)
        for name, _ in conds:
            needs = registry.gate_report(name).name
            if needs not in names:
                raise UsageError(f"--fail-on {name} needs the {needs} report; "
                                 "add it to --only")
        if by is not None and by not in GROUPINGS:
            raise UsageError(f"--by must be pod or container, not {by[:40]!r}")
        top_n = parse_rows(top, "--top") if top is not None else None
        rows_n = parse_rows(rows, "--rows") if rows is not None else top_n
        older_ns = parse_duration_ns(older, "--older", minimum_ns=0) if older is not None else 0
        opts = ReportOptions(
            older_ns=older_ns,
            min_size=parse_size(min_size, "--min-size") if min_size is not None else 0,
            top=top_n,
            window_s=parse_duration_ns(window, "--window") / NS_PER_S,
            thrash_min=parse_count(thrash_min, "--thrash-min", minimum=1), by=by,
            oom_window_s=parse_duration_ns(oom_window, "--oom-window") / NS_PER_S)
        sites = parse_site_filter(site_filter)
        t = open_trace(trace)
        inp = replace(inputs_from_trace(t), site_filter=sites)
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
            _emit(doc, fmt, output, rows_n, by_layer)
        hits = gate_hits(doc, conds)
        if hits:
            raise FindingsTriggered("--fail-on: " + "; ".join(hits))


def _with_progress(inp: Inputs, names: list[str], opts: ReportOptions,
                   show: bool) -> dict[str, Any]:
    from gputrace.analyses.run import run_reports

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


def _emit(doc: dict[str, Any], fmt: str, output: str | None, rows: int | None,
          by_layer: bool = False) -> None:
    from gputrace.render.json_doc import render_json
    from gputrace.render.terminal import render_terminal

    if output:
        try:
            with Path(output).open("w", encoding="utf-8") as f:
                if fmt == "json":
                    f.write(render_json(doc))
                else:
                    render_terminal(doc, f, color=False, rows=rows, by_layer=by_layer)
        except OSError as e:
            raise GputraceError(f"cannot write {output}: {e.strerror or e}") from None
    elif fmt == "json":
        sys.stdout.write(render_json(doc))
    else:
        import shutil

        tty = sys.stdout.isatty()
        render_terminal(doc, sys.stdout, color=tty, rows=rows, by_layer=by_layer,
                        width=shutil.get_terminal_size().columns if tty else None)
