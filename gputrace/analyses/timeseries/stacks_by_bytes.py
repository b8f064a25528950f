"""Which call stacks hold the bytes (leaked, or every allocation)?

From the joined allocations model, so each piece of memory is told once; as
folded rows and as a tree for the leak icicle plot.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from gputrace.analyses.allocations.pieces import COUNTED
from gputrace.analyses.helpers.allocators import CACHED, PROGRAM, stack_allocators
from gputrace.analyses.helpers.inputs import Inputs
from gputrace.analyses.helpers.partition import Slice, per_slice
from gputrace.analyses.helpers.sites import recorded_sites


def _slice_stacks(sl: Slice, allocated: bool) -> pl.DataFrame:
    """Bytes by (layer, pid, stack or driver label) of one pid slice, from its
    allocations model: leaked API allocations by stack and, for processes without API
    calls, leaked driver allocations (`class` unattributed) by what they are; with
    `allocated`, every API allocation and every driver allocation, leaked or not."""
    r, pieces = sl.model(held_only=not allocated)
    api = r.filter(pl.col("layer") == "api")
    drv = pieces.filter(pl.col("class") != "api")
    if allocated:
        drv_bytes = pl.when(pl.col("rm_count") > 0).then("rm_bytes").otherwise("uvm_bytes")
    else:
        # the leak headline: API bytes of leaked API allocations, driver bytes of
        # unattributed pieces; driver-made memory of API processes is not a leak
        # ... nor is what a caching allocator keeps by design (leaks.held_by_allocator)
        owners = stack_allocators(sl.inp.scan("stacks")).select(
            "pid", "stack_id", "allocator").collect()
        api = (api.filter(pl.col("kind").is_not_null())
               .join(owners, on=["pid", "stack_id"], how="left")
               .filter(~pl.col("allocator").fill_null(PROGRAM).is_in(CACHED)))
        drv = drv.filter(pl.col("kind").is_not_null() & (pl.col(COUNTED) > 0))
        drv_bytes = pl.col(COUNTED)
    by_stack = api.group_by("pid", "stack_id").agg(
        layer=pl.lit("api"), bytes=pl.col("size_bytes").sum(), count=pl.len(),
        comm=pl.col("comm").drop_nulls().first(), what=pl.lit(None, pl.String))
    by_what = drv.with_columns(layer=pl.when(pl.col("rm_count") > 0).then(pl.lit("rm"))
                               .otherwise(pl.lit("uvm")), _b=drv_bytes).group_by(
        "layer", "pid", "what").agg(
        bytes=pl.col("_b").sum(), count=pl.len(), comm=pl.col("comm").drop_nulls().first(),
        stack_id=pl.lit(None, pl.Int64))
    cols = ["layer", "pid", "stack_id", "what", "comm", "bytes", "count"]
    return pl.concat([by_stack.select(cols), by_what.select(cols)], how="vertical_relaxed")


def folded_stacks(inp: Inputs, allocated: bool = False) -> list[dict[str, Any]]:
    """Bytes by call stack from the joined allocations model (each piece of memory told
    once): leaked bytes as the leak headline counts them (their sum is
    `leaks.total_bytes`) or, with `allocated`, every allocation. One row per (layer,
    pid, stack): frames outermost first (without the unwinder, interpreter and
    dispatcher frames) and its site; driver memory has `[no stack]` and its kind."""
    parts = per_slice(inp, {"s": lambda sl: _slice_stacks(sl, allocated)})["s"]
    agg = (pl.concat(parts, how="vertical_relaxed").filter(pl.col("bytes") > 0)
           .with_columns(pl.col("stack_id").cast(pl.Int64)))
    # a flame graph of the stacks without the unwinder, interpreter and dispatcher
    frames = (recorded_sites(inp.scan("stacks"), inp.site_filter, site_frames=True)
              .select("pid", "stack_id", "site", pl.col("site_frames").alias("frames"))
              .collect() if inp.has("api") else
              pl.DataFrame(schema={"pid": pl.Int32, "stack_id": pl.Int64, "site": pl.String,
                                   "frames": pl.String}))
    df = (agg.join(frames.with_columns(pl.col("stack_id").cast(pl.Int64)),
                   on=["pid", "stack_id"], how="left")
          .sort(["bytes", "layer", "pid", "stack_id", "what"],
                descending=[True, False, False, False, False], nulls_last=True))
    out = []
    for r in df.iter_rows(named=True):
        inner_first = r["frames"].split(" < ") if r["frames"] else ["[no stack]"]
        if r["what"] is not None:
            inner_first.insert(0, str(r["what"]))
        out.append({"layer": r["layer"], "pid": r["pid"], "comm": r["comm"] or "?",
                    "stack_id": r["stack_id"], "frames": inner_first[::-1],
                    "site": r["site"] or str(r["what"] or "[no stack]"),
                    "bytes": int(r["bytes"]), "count": int(r["count"])})
    return out


TREE_STACKS = 200
"""Stacks drawn in the leak icicle; the rest form one "other stacks" node per layer."""


def icicle(rows: list[dict[str, Any]], most: int = TREE_STACKS) -> dict[str, list[Any]]:
    """Folded stacks as a tree (ids, labels, parents, values) for an icicle plot:
    layer, then process, then frames outermost first; a node's value is its subtree's.
    Past `most` stacks, the rest of each layer is one node, so the tree's total is
    every row's (the leak headline, for leaked rows)."""
    value: dict[str, int] = {}
    label: dict[str, str] = {}
    parent: dict[str, str] = {}
    rest: dict[str, list[int]] = {}
    for r in rows[most:]:
        acc = rest.setdefault(r["layer"], [0, 0])
        acc[0] += r["bytes"]
        acc[1] += 1
    paths = [([r["layer"], f"{r['comm']} ({r['pid']})", *r["frames"]], r["bytes"])
             for r in rows[:most]]
    paths += [([layer, f"{n:,} other stacks"], b) for layer, (b, n) in rest.items()]
    for path, nbytes in paths:
        node = ""
        for depth, name in enumerate(path):
            child = f"{node}/{depth}:{name}"
            label.setdefault(child, name)
            parent.setdefault(child, node)
            value[child] = value.get(child, 0) + nbytes
            node = child
    ids = list(value)
    return {"ids": ids, "labels": [label[i] for i in ids], "parents": [parent[i] for i in ids],
            "values": [value[i] for i in ids]}
