"""How an allocator stack reads: each frame as `function (file:line)`, innermost first.
Shared by the allocator reports (tensors, pool, growth)."""

from __future__ import annotations

import polars as pl

from gputrace.analyses.helpers.inputs import Inputs
from gputrace.analyses.helpers.sites import allocator_sites


def frame_label() -> pl.Expr:
    """`function (file:line)` of an allocator_frames row; `?` for what is missing."""
    return pl.format("{} ({}:{})", pl.col("function").fill_null("?"),
                     pl.col("filename").fill_null("?"),
                     pl.col("line").cast(pl.String).fill_null("?"))


def stack_labels(inp: Inputs) -> pl.LazyFrame:
    """One row per stack_id: `top_frame` (the site: the first frame of the user's own
    code, helpers/sites.py), `site` (the same with its full path, the same in every
    trace: what `diff` matches) and `frames` (innermost first)."""
    return (inp.scan("allocator_frames").sort("stack_id", "depth")
            .group_by("stack_id", maintain_order=True)
            .agg(frame_label().alias("frames"))
            .join(allocator_sites(inp.scan("allocator_frames"), inp.site_filter)
                  .select("stack_id", pl.col("site").alias("top_frame"),
                          pl.col("site_id").alias("site")), on="stack_id"))


def with_labels(inp: Inputs, rows: pl.LazyFrame) -> pl.LazyFrame:
    """`rows` (with a stack_id) plus top_frame and frames; a row without a stack says
    `(no stack recorded)`."""
    return (rows.join(stack_labels(inp), on="stack_id", how="left")
            .with_columns(pl.col("top_frame").fill_null("(no stack recorded)"),
                          pl.col("frames").fill_null([])))
