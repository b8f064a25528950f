"""The `gputrace` command line: one typer app, one module per command.

Every user error ends as one line on stderr and a non-zero exit status; a
traceback means a bug in gputrace.

Commands are registered when `main` runs, and only the one invoked (all of them
for the top-level help): `gputrace record` on a production host then imports
neither polars nor the analysis and rendering stack.
"""

from __future__ import annotations

import importlib
import sys
from typing import Annotated

import pyarrow as pa
import typer

from gputrace import __version__
from gputrace.errors import GputraceError, UsageError
from gputrace.options import parse_rows
from gputrace.render.safe import printable, printable_tree

# one module per command in gputrace/commands/, each with register(app)
COMMANDS = ("record", "convert", "analyze", "diff", "doctor", "export", "fleet", "top", "import")
# a command whose name is a Python keyword lives in a module of another name
_MODULES = {"import": "import_cmd"}
_registered: set[str] = set()

EPILOG = """\b
Examples:
  gputrace record -o run1 -- python train.py   trace one job and its children
  gputrace convert run1                        decode a `record --raw` trace
  gputrace info run1                           what the trace holds
  gputrace analyze run1 --only leaks           what is still allocated, and by whom
  gputrace dump run1 ioctls --limit 20         the raw events
"""

app = typer.Typer(
    name="gputrace",
    help="eBPF tracing and offline analysis of NVIDIA GPU memory.",
    epilog=EPILOG,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gputrace {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print version.")
    ] = False,
) -> None:
    """eBPF tracing and offline analysis of NVIDIA GPU memory."""


@app.command()
def info(
    trace: Annotated[str, typer.Argument(help="Trace directory.")],
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Summarize a trace: status, host, layers, hooks, drops, rows per table."""
    from gputrace.commands.info import render_info, trace_info
    from gputrace.trace.reader import open_trace

    t = open_trace(trace, raw_ok=True)
    facts = trace_info(t)
    # Text goes to a terminal: hostnames, commands and hook notes come from the
    # traced host, so their control characters are shown escaped; JSON keeps them.
    typer.echo(render_info(facts, "json") if json_out else render_info(printable_tree(facts)))


@app.command()
def dump(
    trace: Annotated[str, typer.Argument(help="Trace directory.")],
    table: Annotated[str, typer.Argument(help="Table name, e.g. ioctls, cuda_calls.")],
    limit: Annotated[
        str | None, typer.Option("--limit", "-n", metavar="N", help="At most N rows.")
    ] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="table, csv or json (lines).")] = (
        "table"
    ),
) -> None:
    """Print the rows of one table."""
    from gputrace.commands.dump import FORMATS, dump_table
    from gputrace.trace.reader import open_trace

    if fmt not in FORMATS:
        raise UsageError(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    rows = parse_rows(limit, "--limit") if limit is not None else None
    t = open_trace(trace)
    dump_table(t, table, limit=rows, fmt=fmt)


def register(names: tuple[str, ...] = COMMANDS) -> typer.Typer:
    """Add these commands to `app` (once each, in COMMANDS order); returns it."""
    for name in COMMANDS:
        if name in names and name not in _registered:
            importlib.import_module(f"gputrace.commands.{_MODULES.get(name, name)}").register(app)
            _registered.add(name)
    return app


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the app, turning user errors into one-line messages."""
    args = sys.argv[1:] if argv is None else argv
    first = next((a for a in args if not a.startswith("-")), None)
    register((first,) if first in COMMANDS else COMMANDS)
    try:
        rc = app(args=argv, standalone_mode=False)
    except GputraceError as e:
        # Messages quote paths, manifest fields and option text: one line, no escapes.
        typer.echo(f"gputrace: error: {printable(e)}", err=True)
        return e.exit_code
    except typer.Exit as e:
        return int(e.exit_code or 0)
    except typer.Abort:
        typer.echo("gputrace: aborted", err=True)
        return 130
    except (pa.ArrowException, OSError) as e:
        # Corruption that footer checks cannot see surfaces while reading data.
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        typer.echo(f"gputrace: error: {printable(first)}", err=True)
        return 1
    except Exception as e:
        import polars.exceptions as plx

        # Usage errors: click's ClickException, vendored by typer >= 0.2x (where it is
        # also a TyperException); both know how to print themselves.
        show, code = getattr(e, "show", None), getattr(e, "exit_code", None)
        if callable(show) and isinstance(code, int):
            show()
            return code
        if isinstance(e, plx.PolarsError):
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            typer.echo(f"gputrace: error: corrupt or unreadable trace data: {printable(first)}",
                       err=True)
            return 1
        raise
    # With standalone_mode=False click returns typer.Exit's code instead of raising.
    return rc if isinstance(rc, int) else 0


if __name__ == "__main__":
    sys.exit(main())
