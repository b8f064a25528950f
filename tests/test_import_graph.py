"""A production host installs little: `record` imports only bcc, numpy, pyarrow,
typer (for the CLI) and the standard library. Each check runs in a fresh
interpreter and lists the modules it loaded."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# the analysis, reporting and fleet stack: never needed to record
FORBIDDEN = ("polars", "pydantic", "rich", "plotly", "dask", "duckdb", "pandas", "distributed",
             "fsspec", "s3fs", "boto3", "jinja2")  # fmt: skip

PROBE = """
import json, sys
{body}
print(json.dumps(sorted({{m.split(".")[0] for m in sys.modules}})))
"""


TYPER_ALONE = """
import typer
app = typer.Typer(add_completion=False)
@app.callback()
def main() -> None: pass
@app.command()
def cmd(n: int = 1, name: str = "x", flag: bool = False) -> None: pass
try:
    app(args=["cmd", "--help"], standalone_mode=False)
except SystemExit:
    pass
"""


def loaded(body: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROBE.format(body=body)], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    return list(json.loads(out.splitlines()[-1]))


@pytest.mark.parametrize(
    "body",
    [
        "import gputrace.commands.record, gputrace.record.recorder",
        "import gputrace, gputrace.schema, gputrace.trace.writer, gputrace.trace.reader",
        # the CLI as `gputrace record --help` runs it (help exits through SystemExit)
        "import gputrace.cli\ntry:\n    gputrace.cli.main(['record', '--help'])\n"
        "except SystemExit:\n    pass",
    ],
    ids=["record-modules", "trace-writer", "record-help"],
)
def test_record_imports_no_analysis_stack(body: str) -> None:
    mods = loaded(body)
    assert "pyarrow" in mods  # the probe itself works: the writer's dependency is there
    # what typer itself loads to parse and print help (recent typers coerce options
    # with pydantic) comes with typer, not with gputrace
    bad = sorted(set(mods) & set(FORBIDDEN) - set(loaded(TYPER_ALONE)))
    assert not bad, f"recording imports {bad}"


def test_analysis_still_loads_polars() -> None:
    """The check can fail: the analysis side does import polars."""
    assert "polars" in loaded("import gputrace.analyses.leaks")


def test_every_command_still_registered() -> None:
    """Lazy registration keeps the top-level help complete."""
    r = subprocess.run([sys.executable, "-m", "gputrace.cli", "--help"], capture_output=True,
                       text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    from gputrace.cli import COMMANDS

    for name in (*COMMANDS, "info", "dump"):
        assert name in r.stdout, name
