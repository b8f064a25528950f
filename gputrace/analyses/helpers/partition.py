"""Which processes can be analysed apart, to bound memory on large traces?

Every allocation key (pointer, handle, address, RM object) includes the pid,
and so do the process, stack and file tables: lifetimes, pairing, RM object
trees, leaks, growth and per-process memory of one process depend on that
process's rows only. `pid_slices` cuts an `Inputs` into slices of pids
(pid mod k, k from the row counts of the tables lifetimes read), each with
every per-process table filtered to its pids and every other table whole;
reports compute on one slice at a time and concatenate or sum the small
results. The joined `allocations` model is per process too, so it is computed
per slice, once, and shared by the reports (`Slice.model`). Traces under
`SLICE_ROWS` rows stay one slice (no extra scans).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TypeVar

import polars as pl

from gputrace.analyses.helpers.inputs import Inputs
from gputrace.analyses.helpers.lifetimes import lifetimes

T = TypeVar("T")

SLICE_ROWS = 16_000_000
"""Rows of the tables lifetimes read (ioctls, cuda_calls, mappings) per slice."""
PER_PROCESS = ("ioctls", "cuda_calls", "mappings", "files", "processes", "stacks")


def slice_count(inp: Inputs, slice_rows: int | None = None) -> int:
    """How many pid slices keep each under `slice_rows` (default `SLICE_ROWS`) rows of
    the tables lifetimes read (1 for small traces)."""
    counts = pl.collect_all([inp.scan(n).select(pl.len().cast(pl.Int64))
                             for n in ("ioctls", "cuda_calls", "mappings")])
    rows = sum(int(c.item()) for c in counts)
    return max(1, -(-rows // (slice_rows or SLICE_ROWS)))


def pid_slices(inp: Inputs, k: int) -> list[Inputs]:
    """`inp` cut into `k` slices by pid mod k (null pids go with slice 0)."""
    if k <= 1:
        return [inp]

    def part(i: int) -> Inputs:
        keep = (pl.col("pid").cast(pl.Int64).abs() % k).fill_null(0) == i
        return replace(inp, tables={n: t.filter(keep) if n in PER_PROCESS else t
                                    for n, t in inp.tables.items()})

    return [part(i) for i in range(k)]


class Slice:
    """One pid slice: its inputs, its lifetimes (collected once) and, computed at most
    once and shared by every report that asks, its `allocations` model."""

    def __init__(self, inp: Inputs) -> None:
        self.inp = inp
        self._lt = lifetimes(inp).collect()
        self.lifetimes = self._lt.lazy()
        self._pids: pl.DataFrame | None = None
        self._model: dict[bool, tuple[pl.DataFrame, pl.DataFrame]] = {}

    def model(self, held_only: bool = False) -> tuple[pl.DataFrame, pl.DataFrame]:
        """(rows, pieces): the memory lifetime rows linked into pieces
        (`allocations.rows`) and one row per piece (`allocations.allocations`); with
        `held_only`, only the pieces still holding memory at the end of the trace or
        at their process's exit (what the leak report reads: freed pieces skipped)."""
        from gputrace.analyses.allocations.pieces import allocations
        from gputrace.analyses.allocations.rows import rows

        inp = self.inp
        if self._pids is None:
            self._pids = (inp.scan("cuda_calls").select("pid").unique().collect()
                          if inp.has("api") else pl.DataFrame(schema={"pid": pl.Int32}))
        if held_only not in self._model:
            r = rows(self._lt, inp.scan("processes"), inp.end_ns, held_only)
            self._model[held_only] = (r, allocations(r, self._pids))
        return self._model[held_only]


def per_slice(inp: Inputs, steps: Mapping[str, Callable[[Slice], T]]) -> dict[str, list[T]]:
    """Each step's result for each pid slice (its lifetimes and allocations model
    computed once per slice and shared by the steps)."""
    out: dict[str, list[T]] = {name: [] for name in steps}
    for part in pid_slices(inp, slice_count(inp)):
        sl = Slice(part)
        for name, step in steps.items():
            out[name].append(step(sl))
        del sl
    return out
