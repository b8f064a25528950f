"""Golden files and text snapshots that never write themselves.

A test compares its output with a file under tests/golden/ or tests/snapshots/.
When the file is missing the test fails and names the flag that regenerates it;
only an explicit `--update-goldens` (or GPUTRACE_UPDATE_GOLDENS=1) writes files.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

UPDATE_FLAG = "--update-goldens"
UPDATE_ENV = "GPUTRACE_UPDATE_GOLDENS"


def update_requested(config: pytest.Config) -> bool:
    """Did the person running pytest ask for goldens to be rewritten?"""
    return bool(config.getoption("update_goldens")) or os.environ.get(UPDATE_ENV) == "1"


def check_text(path: Path, text: str, update: bool) -> None:
    """Is `text` exactly the golden file at `path`? (With `update`, rewrite it.)"""
    if update:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    if not path.exists():
        pytest.fail(
            f"golden file {path} is missing; goldens are never written by a plain test run: "
            f"regenerate it on purpose with `python3 -m pytest {UPDATE_FLAG} <test>` "
            f"(or {UPDATE_ENV}=1) and review the diff",
            pytrace=False,
        )
    want = path.read_text()
    if want != text:
        diff = "".join(list(difflib.unified_diff(
            want.splitlines(keepends=True), text.splitlines(keepends=True),
            str(path), "now"))[:60])
        pytest.fail(f"{path.name} differs from the output (rerun with {UPDATE_FLAG} if the "
                    f"change is intended):\n{diff}", pytrace=False)
