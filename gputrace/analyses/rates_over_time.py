"""How many faults, fault batches and migrations per second, over time?

Counts per bucket divided by the bucket's length; every bucket is kept, empty
ones as 0.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from gputrace.analyses.downsample import BUCKETS, bucket_of, table_recorded
from gputrace.analyses.helpers.common import NS_PER_S
from gputrace.analyses.helpers.inputs import Inputs


def _rate(inp: Inputs, frame: pl.LazyFrame, by: str | None, buckets: int
          ) -> list[dict[str, Any]]:
    span = max(inp.end_ns - inp.start_ns, 1)
    width_s = span / buckets / NS_PER_S
    keys = ["_b"] if by is None else [by, "_b"]
    df = (frame.with_columns(_b=bucket_of(inp, buckets)).group_by(keys).agg(n=pl.len())
          .sort(keys).collect())
    out = []
    groups = [((None,), df)] if by is None else list(df.group_by(by, maintain_order=True))
    for k, g in groups:
        # every bucket, empty ones as 0: a rate holds no value across a gap
        counts = [0] * buckets
        for b, n in zip(g["_b"], g["n"], strict=True):
            counts[int(b)] = int(n)
        out.append({"name": None if by is None else str(k[0]),
                    "t_s": [round(b * width_s, 6) for b in range(buckets)],
                    "per_s": [round(n / width_s, 6) for n in counts],
                    "events": sum(counts)})
    return out


def rate_buckets(inp: Inputs, window_s: float | None, most: int = BUCKETS) -> int:
    """Buckets for rates: the fault-rate report's window when it gives at most `most`
    buckets (so plot and table agree on the busiest window), else `most`."""
    if not window_s:
        return most
    span_s = max(inp.end_ns - inp.start_ns, 1) / NS_PER_S
    return max(1, min(most, -int(-span_s // window_s)))


def fault_rates(inp: Inputs, buckets: int = BUCKETS) -> dict[str, Any]:
    """CPU faults, GPU faults, fault batches and migrations (by cause) per second."""
    faults = inp.scan("faults")
    span_s = max(inp.end_ns - inp.start_ns, 1) / NS_PER_S

    def part(recorded: bool, frame: pl.LazyFrame, by: str | None) -> dict[str, Any]:
        if not recorded:
            return {"recorded": False, "series": []}
        return {"recorded": True, "series": _rate(inp, frame, by, buckets)}

    return {"bucket_s": round(span_s / buckets, 9),
            "cpu_faults": part(inp.has("cpu_faults"),
                               faults.filter(pl.col("source") == "cpu"), None),
            "gpu_faults": part(inp.has("driver") or inp.has("uvm_tools"),
                               faults.filter(pl.col("source") != "cpu"), "source"),
            "fault_batches": part(table_recorded(inp, "fault_batches"),
                                  inp.scan("fault_batches"), None),
            "migrations": part(table_recorded(inp, "migrations"), inp.scan("migrations"),
                               "cause")}
