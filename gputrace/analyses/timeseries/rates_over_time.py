"""How many faults, fault batches and migrations per second, over time?

Counts per bucket divided by the bucket's length; every bucket is kept, empty
ones as 0. Next to a fault-rate report the buckets are that report's windows, so
the plot's busiest bucket is the table's busiest window.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import polars as pl

from gputrace.analyses.fault_rate.fault_windows import window_of, windows
from gputrace.analyses.helpers.common import NS_PER_S
from gputrace.analyses.helpers.inputs import Inputs
from gputrace.analyses.timeseries.downsample import BUCKETS, bucket_of, table_recorded


class Cuts(NamedTuple):
    """How the span is cut for rates: the bucket of each row, and each bucket's start
    and length (ns, from the trace start)."""

    bucket: pl.Expr
    starts_ns: list[float]
    lengths_ns: list[float]


def equal_cuts(inp: Inputs, buckets: int) -> Cuts:
    """`buckets` equal buckets of the trace's span (the plots' rule)."""
    width = max(inp.end_ns - inp.start_ns, 1) / buckets
    return Cuts(bucket_of(inp, buckets), [b * width for b in range(buckets)],
                [width] * buckets)


def _rate(frame: pl.LazyFrame, by: str | None, cuts: Cuts) -> list[dict[str, Any]]:
    keys = ["_b"] if by is None else [by, "_b"]
    df = (frame.with_columns(_b=cuts.bucket).group_by(keys).agg(n=pl.len())
          .sort(keys).collect())
    out = []
    groups = [((None,), df)] if by is None else list(df.group_by(by, maintain_order=True))
    for k, g in groups:
        # every bucket, empty ones as 0: a rate holds no value across a gap
        counts = [0] * len(cuts.starts_ns)
        for b, n in zip(g["_b"], g["n"], strict=True):
            counts[int(b)] = int(n)
        out.append({"name": None if by is None else str(k[0]),
                    "t_s": [round(t / NS_PER_S, 6) for t in cuts.starts_ns],
                    "per_s": [round(n * NS_PER_S / length, 6)
                              for n, length in zip(counts, cuts.lengths_ns, strict=True)],
                    "events": sum(counts)})
    return out


def rate_cuts(inp: Inputs, window_s: float | None, most: int = BUCKETS) -> Cuts:
    """Cuts for rates: the fault-rate report's windows when they are at most `most`
    (so plot and table agree on every window, the busiest included), else `most`
    equal buckets."""
    if window_s:
        # the report's own windows (fault_windows.windows: a short remainder joins the
        # last one), so a plotted rate is the table's rate for that window
        w, k, last = windows(inp.start_ns, inp.end_ns, window_s)
        if k <= most:
            return Cuts(window_of(inp.start_ns, w, k), [float(b * w) for b in range(k)],
                        [float(w)] * (k - 1) + [float(last)])
    return equal_cuts(inp, most)


def fault_rates(inp: Inputs, cuts: Cuts | int = BUCKETS) -> dict[str, Any]:
    """CPU faults, GPU faults, fault batches and migrations (by cause) per second, per
    bucket of `cuts` (or of that many equal buckets)."""
    if isinstance(cuts, int):
        cuts = equal_cuts(inp, cuts)
    faults = inp.scan("faults")

    def part(recorded: bool, frame: pl.LazyFrame, by: str | None) -> dict[str, Any]:
        if not recorded:
            return {"recorded": False, "series": []}
        return {"recorded": True, "series": _rate(frame, by, cuts)}

    return {"bucket_s": round(cuts.lengths_ns[0] / NS_PER_S, 9),
            "cpu_faults": part(inp.has("cpu_faults"),
                               faults.filter(pl.col("source") == "cpu"), None),
            "gpu_faults": part(inp.has("driver") or inp.has("uvm_tools"),
                               faults.filter(pl.col("source") != "cpu"), "source"),
            "fault_batches": part(table_recorded(inp, "fault_batches"),
                                  inp.scan("fault_batches"), None),
            "migrations": part(table_recorded(inp, "migrations"), inp.scan("migrations"),
                               "cause")}
