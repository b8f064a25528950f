"""What does each plot of the HTML report and the Perfetto timeline show?

The series are built by downsample (the one downsampling rule), memory_over_time,
rates_over_time, latency, stacks_by_bytes and active_memory; this module gathers them for the
HTML report (`plot_series`) and the Perfetto timeline (`timeline`).

Everything returned is JSON-ready; renderers only draw it.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from gputrace.analyses.helpers.inputs import Inputs
from gputrace.analyses.timeseries.active_memory import active_memory
from gputrace.analyses.timeseries.allocator_state import allocator_state
from gputrace.analyses.timeseries.downsample import BUCKETS
from gputrace.analyses.timeseries.latency import latency_histograms
from gputrace.analyses.timeseries.memory_over_time import gpu_bytes, live_bytes
from gputrace.analyses.timeseries.rates_over_time import fault_rates, rate_cuts
from gputrace.analyses.timeseries.stacks_by_bytes import folded_stacks, icicle


def plot_series(inp: Inputs, doc: dict[str, Any], buckets: int = BUCKETS) -> dict[str, Any]:
    """Every series the HTML report draws, next to the report document `doc`."""
    leaks = doc.get("leaks") or {}
    flagged = {(g["layer"], g["pid"]) for g in leaks.get("growth") or [] if g.get("flagged")}
    rows = folded_stacks(inp)
    fr = doc.get("fault_rate") or {}
    return {"live_bytes": live_bytes(inp, buckets, flagged),
            "gpu_bytes": gpu_bytes(inp, buckets),
            "fault_rates": fault_rates(inp, rate_cuts(inp, fr.get("window_s"), buckets)),
            "latency": latency_histograms(inp), "leak_stacks": rows[:200],
            "leak_tree": icicle(rows), "active_memory": active_memory(inp),
            "allocator_state": allocator_state(inp, buckets)}


TIMELINE_BUCKETS = 2_000
"""Counter points per series in the Perfetto timeline (min/max decimated like the plots)."""


def timeline(inp: Inputs, buckets: int = TIMELINE_BUCKETS) -> dict[str, Any]:
    """What the Perfetto timeline shows: call rows (slices), fault and migration rows
    (instants) as lazy frames in time order, and counter series."""
    threads = pl.concat([inp.scan(t).select("pid", "tid", "comm") for t in
                         ("ioctls", "cuda_calls")]).unique(["pid", "tid"], keep="first")
    names = (inp.scan("processes").select("pid", pl.col("comm").alias("process"))
             .unique("pid", keep="first"))
    return {
        "start_ns": inp.start_ns,
        "threads": threads.join(names, on="pid", how="left").sort("pid", "tid"),
        "ioctls": inp.scan("ioctls").select(
            "ts_ns", "pid", "tid", pl.col("name").fill_null("ioctl"), "latency_ns",
            "size_bytes", pl.col("h_object").alias("handle"), "status", "ret", "gpu_index"),
        "cuda_calls": inp.scan("cuda_calls").select(
            "ts_ns", "pid", "tid", pl.col("func").fill_null("cuda"), "latency_ns",
            "size_bytes", "ptr", "handle", "result"),
        "faults": inp.scan("faults").select("ts_ns", "pid", "source", "access_type",
                                            "gpu_index", "address"),
        "migrations": inp.scan("migrations").select("ts_ns", "pid", "cause", "src", "dst",
                                                    "size_bytes", "address"),
        "live_bytes": live_bytes(inp, buckets, max_series=None),
        "gpu_bytes": gpu_bytes(inp, buckets),
        "fault_rates": fault_rates(inp, min(buckets, 2000)),
    }
