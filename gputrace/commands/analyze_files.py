"""`analyze --format html|perfetto|folded`: reports and timelines written as files."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from gputrace.analyses.helpers.inputs import Inputs
from gputrace.errors import GputraceError


@contextlib.contextmanager
def progress(show: bool, total: int) -> Iterator[Callable[[str], None]]:
    """A stage-by-stage progress display on stderr when `show` (stderr is a terminal and
    the trace is big); a no-op step function otherwise."""
    if not show:
        yield lambda _: None
        return
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as prog:
        task = prog.add_task("exporting", total=total)
        yield lambda stage: prog.update(task, description=stage, advance=1)


@contextlib.contextmanager
def opened(output: str | None, binary: bool) -> Iterator[IO[Any]]:
    """`output` opened for writing (stdout when None), OSErrors as one-line errors."""
    if output is None:
        yield sys.stdout.buffer if binary else sys.stdout
        return
    try:
        f = Path(output).open("wb") if binary else Path(output).open("w", encoding="utf-8")  # noqa: SIM115
        with f:
            yield f
    except OSError as e:
        raise GputraceError(f"cannot write {output}: {e.strerror or e}") from None


def export(inp: Inputs, fmt: str, output: str | None, allocated: bool = False,
           show: bool = False) -> None:
    """Write the Perfetto timeline or the folded stacks of a trace."""
    from gputrace.analyses.timeseries import timeline
    from gputrace.analyses.timeseries.stacks_by_bytes import folded_stacks

    with progress(show, 2) as step:
        if fmt == "folded":
            from gputrace.render.folded import render_folded

            step("stacks")
            text = render_folded(folded_stacks(inp, allocated))
            with opened(output, False) as f:
                f.write(text)
            return
        from gputrace.render.perfetto import render_perfetto

        step("timeline series")
        tl = timeline(inp)
        step("writing perfetto packets")
        with opened(output, True) as f:
            render_perfetto(tl, f)  # type: ignore[arg-type]


def export_html(trace: Any, inp: Inputs, doc: dict[str, Any], output: str | None,
                show: bool = False) -> None:
    """Write the HTML report of `doc`, with the series its plots draw."""
    from gputrace.analyses.timeseries import plot_series
    from gputrace.commands.info import trace_info
    from gputrace.render.html import render_html

    with progress(show, 2) as step:
        step("plot series")
        series = plot_series(inp, doc)
        step("writing html")
        page = render_html(doc, series, trace_info(trace))
        with opened(output, False) as f:
            f.write(page)
