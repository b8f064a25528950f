"""Shared helpers for the analyze tests: scenario builders and running reports."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

from gputrace.analyses import registry
from gputrace.analyses.helpers.inputs import inputs_from_trace
from gputrace.analyses.report_spec import ReportOptions
from gputrace.analyses.run import run_reports
from gputrace.render.json_doc import render_json
from gputrace.trace.reader import open_trace
from tests.conftest import FIXTURES

SCENARIO_DIR = FIXTURES / "scenarios"
GOLDEN = Path(__file__).resolve().parent / "golden"
ALL = registry.names()
OPTS = ReportOptions()


def scenarios() -> ModuleType:
    spec = importlib.util.spec_from_file_location("scenario_build", SCENARIO_DIR / "build.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def analyze(path: Path | str, names: list[str] | None = None, **opts: Any) -> dict[str, Any]:
    """The JSON document exactly as `gputrace analyze --format json` prints it."""
    doc = run_reports(inputs_from_trace(open_trace(path)), names or None, replace(OPTS, **opts))
    parsed: dict[str, Any] = json.loads(render_json(doc))
    return parsed
