"""Which container and pod failed, and which held the GPU? The failing process's and
every holder's identity columns (helpers/identity.py), each of the process instance
that held the pid at the incident, and the incidents added up per pod or container
(`analyze --by`)."""

from __future__ import annotations

from typing import Any

import polars as pl

from gputrace.analyses.helpers.identity import GROUP_KEYS, IDENTITY, by_identity, with_identity
from gputrace.analyses.helpers.inputs import Inputs

_KEYS = {"i": pl.Int64, "h": pl.Int64, "pid": pl.Int32, "ts_ns": pl.Int64}


def _rows(incidents: list[dict[str, Any]]) -> pl.LazyFrame:
    """One row per incident (h = -1) and per holder of it, at the incident's time."""
    rows = [(i, -1, inc["pid"], inc["ts_ns"]) for i, inc in enumerate(incidents)]
    rows += [(i, h, holder["pid"], inc["ts_ns"]) for i, inc in enumerate(incidents)
             for h, holder in enumerate(inc["holders"])]  # fmt: skip
    return pl.LazyFrame(rows, schema=_KEYS, orient="row")


def name_them(inp: Inputs, incidents: list[dict[str, Any]]) -> None:
    """Add the identity columns to every incident and to each of its holders."""
    if not incidents:
        return
    got = with_identity(_rows(incidents), inp.scan("processes"), at="ts_ns").collect()
    for r in got.iter_rows(named=True):
        inc = incidents[r["i"]]
        target = inc if r["h"] < 0 else inc["holders"][r["h"]]
        target.update({c: r[c] for c in IDENTITY})


def by_group(inp: Inputs, incidents: list[dict[str, Any]], by: str) -> list[dict[str, Any]]:
    """Incidents, failures and requested bytes per pod or container (`by`) of the
    failing process."""
    frame = pl.LazyFrame(
        [(inc["pid"], 1, inc["attempts"], inc["requested_bytes"] or 0) for inc in incidents],
        schema={"pid": pl.Int32, "incidents": pl.Int64, "failures": pl.Int64,
                "requested_bytes": pl.UInt64}, orient="row")  # fmt: skip
    sums = ["incidents", "failures", "requested_bytes"]
    got = by_identity(frame, inp.scan("processes"), by, sums).collect()
    # the names and the figures first: a narrow terminal keeps the leading columns
    names = [c for c in GROUP_KEYS[by] if c in ("pod_namespace", "pod_name", "container_name")]
    return got.select(*names, *sums, "processes", pl.exclude(*names, *sums, "processes")).to_dicts()
