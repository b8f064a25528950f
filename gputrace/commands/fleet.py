"""`gputrace fleet analyze`: the reports over a whole exported dataset (docs/fleet.md)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from gputrace.commands.export import STORAGE_HELP, parse_storage_options
from gputrace.errors import GputraceError, UsageError
from gputrace.options import TOP_HELP, parse_count, parse_duration_ns, parse_rows, parse_size

FORMATS = ("terminal", "json", "html")
DEFAULT_TOP = 20


def select(index: dict[str, Any], where: str | None) -> tuple[list[dict[str, Any]], Any]:
    """The index entries `where` selects, each marked `job_filter` when only some of its
    processes are (the answer depends on job fields), and the parsed expression."""
    from gputrace.fleet import where as wh
    from gputrace.fleet.export import index_frame

    entries = [dict(e, job_filter=False) for e in index["traces"].values()]
    if where is None:
        return sorted(entries, key=lambda e: e["trace_id"]), None
    node = wh.parse(where)
    verdict = index_frame(index).select("trace_id", v=wh.to_expr(node, wh.TRACE_FIELDS))
    by_id = dict(zip(verdict["trace_id"], verdict["v"], strict=True))
    jobs = bool(wh.fields(node) & set(wh.JOB_FIELDS))
    out = []
    for e in entries:
        v = by_id[e["trace_id"]]
        if v is True or (v is None and jobs):
            out.append(dict(e, job_filter=v is None))
    return sorted(out, key=lambda e: e["trace_id"]), node


def register(app: typer.Typer) -> None:
    fleet = typer.Typer(name="fleet", help="Reports over many traces (an exported dataset).",
                        no_args_is_help=True, rich_markup_mode=None)
    app.add_typer(fleet)

    @fleet.command()
    def analyze(
        dataset: Annotated[str, typer.Argument(help="Dataset folder or URL from gputrace export.")],
        where: Annotated[str | None, typer.Option(
            "--where", metavar="EXPR",
            help="Traces/jobs to cover, e.g. \"host = a and cmdline ~ train\".")] = None,
        scheduler: Annotated[str | None, typer.Option(
            "--scheduler", metavar="ADDR", help="Dask scheduler (tcp://host:8786); "
            "default: a local cluster.")] = None,
        workers: Annotated[str, typer.Option(
            "--workers", metavar="N", help="Local cluster worker processes.")] = "2",
        fmt: Annotated[str, typer.Option("--format", "-f", help="terminal, json or html.")] = (
            "terminal"),
        output: Annotated[str | None, typer.Option("--output", "-o", help="Write to FILE.")
                          ] = None,
        top: Annotated[str, typer.Option("--top", metavar="N", help=TOP_HELP)] = str(
            DEFAULT_TOP),
        per_trace: Annotated[bool, typer.Option(
            "--per-trace", help="Include each trace's full analyze report (JSON).")] = False,
        older: Annotated[str, typer.Option("--older", metavar="DURATION",
                                           help="Leaks older than DURATION only.")] = "0s",
        min_size: Annotated[str, typer.Option("--min-size", metavar="BYTES",
                                              help="Leaks of at least BYTES only.")] = "0",
        window: Annotated[str, typer.Option("--window", metavar="DURATION",
                                            help="Fault-rate window.")] = "1",
        thrash_min: Annotated[str, typer.Option("--thrash-min", metavar="N",
                                                help="Reversals that make a block thrash.")
                              ] = "3",
        storage_option: Annotated[list[str] | None, typer.Option(
            "--storage-option", metavar="KEY=VALUE", help=STORAGE_HELP)] = None,
    ) -> None:
        """Leaks, fragmentation, oversubscription, fault-rate outliers and drops, fleet-wide."""
        from gputrace.fleet import engine
        from gputrace.fleet.export import read_index
        from gputrace.fleet.store import Store
        from gputrace.fleet.summarize import fleet_document

        if fmt not in FORMATS:
            raise UsageError(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}")
        n_workers = parse_count(workers, "--workers", minimum=1)
        top_n = parse_rows(top, "--top")
        opts = {"older_ns": parse_duration_ns(older, "--older", minimum_ns=0),
                "min_size": parse_size(min_size, "--min-size"), "top": None,
                "window_s": parse_duration_ns(window, "--window") / 1e9,
                "thrash_min": parse_count(thrash_min, "--thrash-min", minimum=1)}
        store = Store(dataset, parse_storage_options(storage_option))
        entries, node = select(read_index(store, create=False), where)
        part, info = engine.run(store, entries, node=node, opts=opts, top=top_n,
                                keep_report=per_trace, scheduler=scheduler, workers=n_workers)
        doc = fleet_document(part, top=top_n, dataset=dataset, where=where, engine=info)
        _emit(doc, fmt, output)


def _emit(doc: dict[str, Any], fmt: str, output: str | None) -> None:
    from gputrace.fleet.render import render_fleet_terminal
    from gputrace.fleet.render_html import render_fleet_html
    from gputrace.render.json_doc import render_json

    def write(f: Any) -> None:
        if fmt == "json":
            f.write(render_json(doc))
        elif fmt == "html":
            f.write(render_fleet_html(doc))
        else:
            render_fleet_terminal(doc, f)

    if output:
        try:
            with Path(output).open("w", encoding="utf-8") as f:
                write(f)
        except OSError as e:
            raise GputraceError(f"cannot write {output}: {e.strerror or e}") from None
    else:
        write(sys.stdout)

