"""`gputrace convert TRACE`: decode the raw parts of a `record --raw` trace into
Parquet, in place (gputrace.importers.raw); any machine, no root."""

from __future__ import annotations

from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def convert(
        trace: Annotated[str, typer.Argument(help="Trace directory recorded with --raw.")],
        jobs: Annotated[
            str | None,
            typer.Option("--jobs", "-j", metavar="N",
                         help="Parts decoded at a time (default: the CPUs this may use)."),
        ] = None,
    ) -> None:
        """Decode a trace's raw parts (record --raw) into Parquet parts, in place.

        Safe to run again after an interruption; a trace without raw parts is left
        as it is, but for the rows of processes still running that a killed
        recorder left (processes/pending.parquet), which become a part.
        """
        import os

        from gputrace.importers.raw import convert as run
        from gputrace.options import parse_count
        from gputrace.render.safe import printable

        n = (parse_count(jobs, "--jobs", minimum=1, maximum=1024) if jobs is not None
             else len(os.sched_getaffinity(0)))  # fmt: skip
        done = run(trace, jobs=n)
        where = printable(trace)  # a path may hold what a terminal acts on
        if done.pending:
            typer.echo(f"{where}: {done.pending} rows of processes still running when the "
                       "recorder was killed kept as a part")  # fmt: skip
        if not done.tables and done.pending:
            return
        if not done.tables:
            typer.echo(f"{where}: no raw parts; nothing to convert")
            return
        note = f", {done.skipped} records skipped as unreadable" if done.skipped else ""
        typer.echo(f"{where}: {done.parts} raw parts decoded into {done.rows} rows of "
                   f"{', '.join(done.tables)}{note}")  # fmt: skip
