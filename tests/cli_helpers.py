"""`gputrace` run inside the test's own process, for tests about what a command prints
and returns rather than about the process: each `python -m gputrace.cli` costs about
a second of CPU importing polars, pyarrow and typer again, and the suite ran hundreds.

`cli` gives what `subprocess.run` gives (a CompletedProcess with the exit status and
the two streams as text). What a fresh process would show on stderr shows there too:
Python's warnings, with a fresh interpreter's filters (pytest's warning capture would
otherwise keep them out of the stream a one-line-error test reads), and logging's
last-resort handler (it writes to whatever `sys.stderr` is). What only a real process
can show stays with a subprocess (`tests.unit.commands.test_errors.gputrace`): output
written to the file descriptors by C code or by other processes (Dask's workers and
scheduler), signals, exit codes of a crash.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
import warnings

# A fresh interpreter's warning filters (python -W and PYTHONWARNINGS unset).
_FRESH_FILTERS = (
    ("default", DeprecationWarning, "__main__"),
    ("ignore", DeprecationWarning, None),
    ("ignore", PendingDeprecationWarning, None),
    ("ignore", ImportWarning, None),
    ("ignore", ResourceWarning, None),
)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`gputrace ARGS` in this process: its exit status, stdout and stderr."""
    from gputrace.cli import main

    out, err = io.StringIO(), io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):  # fmt: skip
        warnings.resetwarnings()
        for action, category, module in reversed(_FRESH_FILTERS):
            if module is None:
                warnings.simplefilter(action, category)  # type: ignore[arg-type]
            else:
                warnings.filterwarnings(action, category=category, module=module)  # type: ignore[arg-type]
        warnings.showwarning = _show_on_stderr
        rc = main(list(args))
    return subprocess.CompletedProcess(["gputrace", *args], rc, out.getvalue(), err.getvalue())


def _show_on_stderr(message: Warning | str, category: type[Warning], filename: str,
                    lineno: int, file: object = None, line: str | None = None) -> None:
    """As Python prints a warning, on the redirected stderr."""
    import sys

    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))
