"""Tables the recorder writes about its own conclusions while recording: alerts
(`record --alert`).
"""

from __future__ import annotations

from gputrace.schema import model
from gputrace.schema.model import F64, I16, I32, I64, STR, Column, Table

ALERTS = Table(
    "alerts",
    "Alerts that fired while recording (`record --alert EXPR`): one row per condition "
    "episode, when it began (docs/live.md).",
    "live",
    (
        Column("ts_ns", I64, "ns", "CLOCK_MONOTONIC time the alert fired", False),
        Column("alert", STR, "", "what was measured, e.g. leak_rate, gpu_free, drops", False),
        Column("expr", STR, "", "the --alert expression as given", False),
        Column("pid", I32, "", "process the alert is about (null for GPU and recording alerts)"),
        Column("comm", STR, "", "that process's name"),
        Column("gpu_index", I16, "", "GPU the alert is about (null for process alerts)"),
        Column("value", F64, "",
               "measured value in base units (bytes, bytes/s, events/s, share, count)", False),
        Column("threshold", F64, "", "the expression's threshold, in the same units",
               False),
    ),
)

CATALOG = model.Catalog(("live",), (ALERTS,))
"""This module's layers and tables, in catalog order (`schema.CATALOG_MODULES`)."""
