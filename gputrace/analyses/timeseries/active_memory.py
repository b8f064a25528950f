"""How much memory is live over time, and which allocation sites hold it?

Live bytes are replayed per allocation site (a call stack: a Python stack in the
allocator layer, a native stack in the API layer) and sampled at the ends of
`buckets` equal buckets of the trace's span, so the sites stack into one total.
The `top` sites with the highest peak are drawn apart and the rest summed as
`other`. From the allocator layer when the trace has one (PyTorch's trace
entries: `alloc` adds a block, the `free_completed` of the same device and
address removes it; blocks allocated before the kept history are not drawn,
since their sites are unknown), else from the API layer's allocation lifetimes.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from gputrace.analyses.allocator.replay import paired_allocs
from gputrace.analyses.helpers.inputs import Inputs
from gputrace.analyses.helpers.lifetimes import lifetimes, memory
from gputrace.analyses.helpers.sites import NO_STACK, allocator_sites
from gputrace.analyses.helpers.stacks import stack_sites
from gputrace.analyses.timeseries.downsample import seconds_since_start

TOP = 8
BUCKETS = 200
OTHER = "other"


def _allocator_deltas(inp: Inputs) -> pl.LazyFrame:
    """(site, ts_ns, delta) of the allocator layer's blocks, site = its stack's frames."""
    ev = (inp.scan("allocator_events")
          .select("ts_ns", "seq", "device", "action", "address", "stack_id",
                  pl.col("size_bytes").cast(pl.Int64).fill_null(0).alias("size"))
          .sort("device", "seq").with_row_index("i"))
    # each alloc with its free, as the replay pairs them (a free whose alloc is before
    # the kept history pairs with none and is not drawn)
    paired = paired_allocs(ev).join(
        ev.select(pl.col("i").alias("free_i"), pl.col("ts_ns").alias("free_ts_ns")),
        on="free_i", how="left")
    deltas = pl.concat([
        paired.select("ts_ns", "device", "stack_id", pl.col("size").alias("delta")),
        paired.filter(pl.col("free_i").is_not_null()).select(
            pl.col("free_ts_ns").alias("ts_ns"), "device", "stack_id",
            (-pl.col("size")).alias("delta"))])
    labels = allocator_sites(inp.scan("allocator_frames"), inp.site_filter)
    return (deltas.join(labels, on="stack_id", how="left")
            .select(pl.col("site").fill_null(NO_STACK), pl.col("frames").fill_null(NO_STACK),
                    "device", "ts_ns", "delta"))


def _api_deltas(inp: Inputs) -> pl.LazyFrame:
    """(site, ts_ns, delta) of the API layer's allocations, site = pid and native stack."""
    lt = memory(lifetimes(inp)).filter(pl.col("layer") == "api").join(
        stack_sites(inp), on=["pid", "stack_id"], how="left")
    site = pl.format("pid {}: {}", pl.col("pid"),
                     pl.col("site").fill_null(NO_STACK)).alias("site")
    frames = pl.col("frames").fill_null(NO_STACK)
    up = lt.select(site, frames, pl.col("alloc_ts_ns").alias("ts_ns"),
                   pl.col("size_bytes").cast(pl.Int64).alias("delta"))
    down = lt.filter(pl.col("free_ts_ns").is_not_null()).select(
        site, frames, pl.col("free_ts_ns").alias("ts_ns"),
        (-pl.col("size_bytes").cast(pl.Int64)).alias("delta"))
    return pl.concat([up, down])


def active_memory(inp: Inputs, buckets: int = BUCKETS, top: int = TOP) -> dict[str, Any]:
    """Live bytes per allocation site at each bucket end: `source` (allocator | api),
    `t_s`, and `devices` ({device, bands}), each band {site, frames, peak, values},
    largest peak first, `other` last; `bands` is the first device's (the API layer
    has one view for all devices: device None). A site's `frames` is the full stack
    of its largest allocation, for the hover."""
    if inp.has("allocator"):
        source, deltas = "allocator", _allocator_deltas(inp)
    elif inp.has("api"):
        source, deltas = "api", _api_deltas(inp).with_columns(device=pl.lit(None, pl.Int64))
    else:
        return {"recorded": False, "source": None, "t_s": [], "bands": [], "devices": []}
    span = max(inp.end_ns - inp.start_ns, 1)
    grid = [inp.start_ns + span * (i + 1) // buckets for i in range(buckets)]
    live = (deltas.with_columns(pl.col("device").cast(pl.Int64)).sort("ts_ns")
            .with_columns(live=pl.col("delta").cum_sum().over("device", "site"))).collect()
    devices = []
    for (dev,), part in sorted(live.partition_by("device", as_dict=True).items(),
                               key=lambda kv: (kv[0][0] is None, kv[0][0] or 0)):
        devices.append({"device": None if dev is None else int(dev),
                        "bands": _bands(part, grid, top)})
    return {"recorded": True, "source": source,
            "t_s": seconds_since_start(inp, pl.Series(grid)), "devices": devices,
            "bands": devices[0]["bands"] if devices else []}


def _bands(live: pl.DataFrame, grid: list[int], top: int) -> list[dict[str, Any]]:
    """One device's bands: its `top` sites by peak, the rest summed as `other`."""
    peaks = (live.group_by("site").agg(pl.col("live").max().alias("peak"),
                                       pl.col("frames").sort_by("delta", descending=True)
                                       .first())
             .sort(["peak", "site"], descending=[True, False]))
    kept = peaks["site"].head(top).to_list()
    frames = dict(zip(peaks["site"], peaks["frames"], strict=True))
    # every site sampled at every bucket end, the sites past `top` summed as one band
    band = pl.when(pl.col("site").is_in(kept)).then(pl.col("site")).otherwise(pl.lit(OTHER))
    grid_df = pl.DataFrame({"ts_ns": grid}).cast(pl.Int64).join(
        live.select("site").unique(), how="cross").sort("ts_ns")
    sampled = (grid_df.join_asof(live.select("site", "ts_ns", "live").sort("ts_ns"),
                                 on="ts_ns", by="site", strategy="backward",
                                 check_sortedness=False)
               .with_columns(pl.col("live").fill_null(0), band=band)
               .group_by("band", "ts_ns").agg(pl.col("live").sum()).sort("ts_ns"))
    order = [*kept, *([OTHER] if peaks.height > len(kept) else [])]
    bands = [{"site": b, "frames": frames.get(b, OTHER),
              "values": [int(v) for v in sampled.filter(pl.col("band") == b)["live"]]}
             for b in order]
    for b in bands:
        b["peak"] = max(b["values"], default=0)
    return bands
