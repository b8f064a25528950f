"""Which call stack made an allocation, in words?

Stacks are stored one frame a row (pid, stack_id, depth, ip, module, offset,
symbol, and for Python frames kind "python", function, filename, line); reports
show a stack as its frames innermost first: a Python frame as
`function (file:line)` (the file's base name; `?` for what the recorder could
not read), a native one as its symbol or, unsymbolized, module+0xoffset (else
0xip), as perf prints them. The one place a stack frame becomes text.
"""

from __future__ import annotations

import polars as pl

from gputrace.analyses.helpers.inputs import Inputs
from gputrace.analyses.helpers.sites import SiteFilter, recorded_sites


def stack_frames(stacks: pl.LazyFrame,
                 site_filter: SiteFilter | None = None) -> pl.LazyFrame:
    """(pid, stack_id, frames, site): `frames` is every frame innermost
    first, joined by ' < ' (a statically linked CUDA runtime's hashed frames as one
    `libcudart (static)`); `site`, the one line tables, legends and diffs show, is
    the first frame in the user's own code, after the CUDA call it made
    (`cudaMalloc < main`), distinct per site (helpers/sites.py)."""
    return recorded_sites(stacks, site_filter).select("pid", "stack_id", "frames", "site")


def stack_sites(inp: Inputs) -> pl.LazyFrame:
    """stack_frames of a trace's recorded stacks, with its `--site-filter`."""
    return stack_frames(inp.scan("stacks"), inp.site_filter)


def python_sites(stacks: pl.LazyFrame) -> pl.LazyFrame:
    """(pid, stack_id, python_site): the innermost Python frame of each stack that
    has one, as text: the line of the program that made the call, which reports
    name in preference to any native frame."""
    return (stacks.filter(pl.col("kind") == "python").sort("pid", "stack_id", "depth")
            .group_by("pid", "stack_id")
            .agg(frame_text().first().alias("python_site")))


def frame_text() -> pl.Expr:
    """One stacks row as text: `function (file:line)` for a Python frame, else the
    native symbol or its address."""
    python = pl.format("{} ({}:{})", pl.col("function").fill_null("?"),
                       pl.col("filename").str.extract(r"([^/]+)$").fill_null("?"),
                       pl.col("line").cast(pl.String).fill_null("?"))
    return (pl.when(pl.col("kind") == "python").then(python)
            .otherwise(pl.coalesce("symbol", _unresolved())))


def _unresolved() -> pl.Expr:
    """An unsymbolized frame as perf prints it: module+0xoffset, else 0xip."""
    def hexa(c: str) -> pl.Expr:
        return pl.col(c).map_elements(lambda v: f"0x{v:x}", return_dtype=pl.String)

    module = pl.col("module").str.extract(r"([^/]+)$")
    return pl.coalesce(pl.format("{}+{}", module, hexa("offset")), hexa("ip"))
