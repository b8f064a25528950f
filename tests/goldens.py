"""Golden files and text snapshots that never write themselves.

A test compares its output with a file under tests/golden/ or tests/snapshots/.
When the file is missing the test fails and names the flag that regenerates it;
only an explicit `--update-goldens` (or GPUTRACE_UPDATE_GOLDENS=1) writes files.
"""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path
from typing import Any

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


# ---- per-report goldens
#
# A fixture's golden is a folder holding one file per report (named by the report's JSON
# key) and one for what belongs to no report (DOCUMENT: the trace's facts and warnings in
# JSON; the warnings printed before every section in text), so a new report adds its own
# files and changes no other. One fixture keeps a whole-document golden too, which checks
# how the parts are put together.

DOCUMENT = "_document"
"""The JSON part that is no report's: the `trace` facts and the document's `warnings`."""
WARNINGS = "_warnings"
"""The terminal part that is no report's: the trace's warnings, printed first."""


def report_keys() -> list[str]:
    """The JSON keys of the registered reports, in registry order."""
    from gputrace.analyses import registry

    return [s.key for s in registry.REPORTS]


def json_parts(doc: dict[str, Any]) -> dict[str, Any]:
    """The JSON document cut into its per-report goldens (by file stem)."""
    keys = report_keys()
    return {**{k: doc[k] for k in keys},
            DOCUMENT: {k: v for k, v in doc.items() if k not in keys}}


def joined_json(folder: Path) -> dict[str, Any]:
    """The JSON document put back together from a folder of per-report goldens."""
    doc: dict[str, Any] = json.loads((folder / f"{DOCUMENT}.json").read_text())
    for k in report_keys():
        doc[k] = json.loads((folder / f"{k}.json").read_text())
    return doc


def joined_text(folder: Path) -> str:
    """The terminal text put back together from a folder of per-report snapshots."""
    return "".join((folder / f"{k}.txt").read_text() for k in [WARNINGS, *report_keys()])


def stale_files(folder: Path, stems: list[str]) -> list[str]:
    """Files of a per-report golden folder that no part names (a report renamed or
    removed leaves them behind)."""
    return sorted(p.name for p in folder.iterdir() if p.stem not in stems)
