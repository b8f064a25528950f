"""Is a caching allocator growing, and which call stacks made it add memory?

A caching allocator keeps what it reserved, so its unfreed segments are not
leaks; but one that adds segments iteration after iteration is growing. The
API allocations of each (process, allocator) known by name
(helpers/allocators), and of the program itself, are replayed and fitted exactly as a process's live
bytes are (leaks/growth: trough per bin, Theil-Sen, the same evidence bar);
the call stacks that asked for each allocator's segments are listed beside it,
most bytes first, each with its `trigger` (the innermost Python frame when the
stack has one, else the allocator's caller: the first frame outward outside its
library), so growth is named by what triggered it.
"""

from __future__ import annotations

import polars as pl

from gputrace.analyses.helpers.allocators import PROGRAM, stack_allocators
from gputrace.analyses.helpers.stacks import python_sites, stack_frames
from gputrace.analyses.leaks.growth import growth


def allocator_growth(lt: pl.LazyFrame, stacks: pl.LazyFrame) -> dict[str, pl.DataFrame]:
    """`allocator_growth`: one fit row per (allocator, pid), `allocator` in place of
    `layer` (`program` for the program's own API allocations); `allocator_segments`:
    (allocator, pid, stack_id, frames, trigger, count, bytes, first_ts_ns) of the API
    allocations each named allocator made."""
    owners = stack_allocators(stacks).select("pid", "stack_id", "allocator")
    api = (lt.filter(pl.col("layer") == "api")
           .join(owners, on=["pid", "stack_id"], how="left")
           .with_columns(pl.col("allocator").fill_null(PROGRAM)))
    # growth() keys its series by (layer, pid): the allocator stands in for the layer
    fits = growth(api.with_columns(layer=pl.col("allocator"))).rename({"layer": "allocator"})
    segs = (api.filter(pl.col("allocator") != PROGRAM).group_by("allocator", "pid", "stack_id")
            .agg(pl.len().cast(pl.Int64).alias("count"), pl.col("size_bytes").sum()
                 .alias("bytes"), pl.col("alloc_ts_ns").min().alias("first_ts_ns"))
            .join(stack_frames(stacks), on=["pid", "stack_id"], how="left")
            .join(_triggers(stacks), on=["pid", "stack_id"], how="left")
            .collect())
    return {"allocator_growth": fits, "allocator_segments": segs}


def _triggers(stacks: pl.LazyFrame) -> pl.LazyFrame:
    """(pid, stack_id, trigger): what made the allocator add a segment. The innermost
    Python frame when the stack has one (the program's line: `main (train.py:64)`),
    else the innermost native frame outside the allocator's own library (its
    caller), symbol else module file name."""
    owners = stack_allocators(stacks)
    st = stacks.join(owners, on=["pid", "stack_id"], how="inner")
    lib = st.filter(pl.col("depth") == pl.col("allocator_depth")).select(
        "pid", "stack_id", pl.col("module").alias("_lib"))
    label = pl.coalesce("symbol", pl.col("module").str.extract(r"([^/]+)$"))
    native = (st.join(lib, on=["pid", "stack_id"])
              .filter((pl.col("depth") > pl.col("allocator_depth"))
                      & (pl.col("module").ne_missing(pl.col("_lib")))
                      & (pl.col("kind").ne_missing("python")))
              .sort("pid", "stack_id", "depth")
              .group_by("pid", "stack_id").agg(label.first().alias("_native")))
    return (owners.select("pid", "stack_id")
            .join(python_sites(st), on=["pid", "stack_id"], how="left")
            .join(native, on=["pid", "stack_id"], how="left")
            .select("pid", "stack_id", pl.coalesce("python_site", "_native").alias("trigger"))
            .filter(pl.col("trigger").is_not_null()))
