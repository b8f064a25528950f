"""Which call stack made an allocation, in words?

Stacks are stored one frame a row (pid, stack_id, depth, ip, module, offset,
symbol); reports show a stack as its frames innermost first, each its symbol
or, unsymbolized, module+0xoffset (else 0xip), as perf prints them.
"""

from __future__ import annotations

import polars as pl


def stack_frames(stacks: pl.LazyFrame) -> pl.LazyFrame:
    """(pid, stack_id, frames): symbols innermost first, joined by ' < '."""
    return (stacks.sort("pid", "stack_id", "depth")
            .group_by("pid", "stack_id", maintain_order=True)
            .agg(pl.coalesce("symbol", _unresolved()).str.join(" < ").alias("frames")))


def _unresolved() -> pl.Expr:
    """An unsymbolized frame as perf prints it: module+0xoffset, else 0xip."""
    def hexa(c: str) -> pl.Expr:
        return pl.col(c).map_elements(lambda v: f"0x{v:x}", return_dtype=pl.String)

    module = pl.col("module").str.extract(r"([^/]+)$")
    return pl.coalesce(pl.format("{}+{}", module, hexa("offset")), hexa("ip"))
