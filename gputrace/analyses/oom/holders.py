"""Who held the GPU when an allocation failed, and what grew before it?

One row per process, keyed by pid (identity columns join on it): the driver's own
accounting (every process RM names, traced or not) beside what gputrace recorded
for it. The recorded figures come from the joined allocation model
(analyses/allocations/held.py), each piece of memory counted once: `held_bytes` at
the instant, `grew_bytes` over the window before it (held at the instant minus held
at the window's start), the same by class (`held_by_class`: program, allocator
pool, CUDA context, driver-only; attributes, never added to the figure), and the
top sites held and grown (one row per class, layers, label and stack: a piece seen
by three layers is one row, its `layer` the layers that saw it). `api_bytes`,
`rm_bytes` and `uvm_bytes` are the per-layer breakdown: what each layer alone shows
live, never to be added. Pieces whose GPU is not known (an API-only piece) count on
every GPU of the question; host memory holds none of a GPU's and is left out.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from gputrace.analyses.allocations.held import (
    CLASS_KEYS,
    HOST_MEMORY,
    by_holder,
    gained,
    held_pieces,
    live_at,
    sites,
)
from gputrace.analyses.helpers.inputs import Inputs
from gputrace.analyses.helpers.lifetimes import VIRTUAL_LAYERS
from gputrace.analyses.helpers.partition import Slice, per_slice
from gputrace.analyses.helpers.stacks import stack_frames

LAYERS = ("api", "rm", "uvm")
SITES = 3
"""Top live sites listed per holder (unless --top says fewer)."""
MAX_HOLDERS = 1000
"""Holders listed per incident, largest first; the rest are counted and added up in
`holders_left_out` (docs/security.md: the driver may list 10^5 pids, and a report
of every one is megabytes nobody reads)."""


class Recorded:
    """The trace's memory lifetimes, stacks and traced pids, read once for every
    incident of a report."""

    def __init__(self, inp: Inputs) -> None:
        self.inp = inp if inp.has("api") else None

        def step(sl: Slice) -> tuple[pl.DataFrame, pl.DataFrame]:
            # the per-layer breakdown: each layer's own live rows
            lt = sl.lifetimes.filter(
                ~pl.col("layer").is_in(list(VIRTUAL_LAYERS))
                & ~pl.col("what").is_in(list(HOST_MEMORY))).select(
                "layer", "pid", "size_bytes", "alloc_ts_ns", "free_ts_ns", "gpu_index")
            return lt.collect(), held_pieces(sl)

        got = per_slice(inp, {"s": step})["s"]
        self.lt = pl.concat([g[0] for g in got])
        self.held = pl.concat([g[1] for g in got], how="diagonal_relaxed")
        self._stacks: dict[tuple[int, int], tuple[str, str] | None] = {}
        procs = inp.scan("processes").select("pid", "comm")
        # traced: the trace holds an event of it (a process the recorder only listed,
        # one that held the device open before the recording, is not)
        seen = [inp.scan(n).select("pid").unique() for n, layer in (
            ("cuda_calls", "api"), ("ioctls", "syscall"), ("mappings", "syscall"),
            ("allocator_events", "allocator")) if inp.has(layer)]
        names, *pids = pl.collect_all([procs, *seen])
        self.comm = {int(p): c for p, c in zip(names["pid"], names["comm"], strict=True)
                     if c is not None}
        self.traced = {int(p) for f in pids for p in f["pid"] if p is not None}

    def stack(self, pid: int, stack_id: int | None, column: str = "frames") -> str | None:
        """A stack of the stacks table as text (None when it holds no such stack): every
        frame, or with `column="site"` from its innermost Python frame outward
        (helpers/stacks.stack_frames); read only for the few stacks a report shows."""
        if stack_id is None or self.inp is None:
            return None
        key = (pid, stack_id)
        if key not in self._stacks:
            f = stack_frames(self.inp.scan("stacks").filter(
                (pl.col("pid") == pid) & (pl.col("stack_id") == stack_id)),
                self.inp.site_filter).collect()
            self._stacks[key] = ((str(f["frames"][0]), str(f["site"][0])) if f.height
                                 else None)  # fmt: skip
        got = self._stacks[key]
        return None if got is None else got[column == "site"]


def _live(at: int) -> pl.Expr:
    return (pl.col("alloc_ts_ns") <= at) & (pl.col("free_ts_ns").is_null()
                                            | (pl.col("free_ts_ns") > at))


def _site_rows(rec: Recorded, pid: int, df: pl.DataFrame, weight: pl.Expr,
               top: int) -> list[dict[str, Any]]:
    """One process's pieces by site (held.sites), as report rows; `layer` is the
    layers that saw each piece (`api+rm+uvm`): one row per piece, whatever its layers."""
    return [{"layer": r["layers"], "class": r["class"], "what": r["what"],
             "stack": rec.stack(pid, r["stack_id"]),
             "site": rec.stack(pid, r["stack_id"], "site"),
             "bytes": int(r["bytes"]), "count": int(r["count"])}
            for r in sites(df, weight, top).iter_rows(named=True)]


def holders(rec: Recorded, gpu: int, at_ns: int, window_ns: int,
            driver: dict[int, int | None], allocator: dict[int, tuple[int, int]] | None,
            top: int | None) -> tuple[list[dict[str, Any]], dict[str, int] | None]:
    """Every process holding memory on `gpu` at `at_ns`, by the driver or by the trace,
    largest first (driver bytes, then recorded bytes), the first `MAX_HOLDERS`; and
    the count and bytes of the rest (None when none was left out)."""
    n_sites = min(SITES, top) if top is not None else SITES
    start = at_ns - window_ns
    here = pl.col("gpu_index").is_null() | (pl.col("gpu_index") == gpu)
    # the per-layer breakdown (labelled per layer, never added)
    per_layer = {(int(r["pid"]), r["layer"]): int(r["b"]) for r in rec.lt.filter(
        here & _live(at_ns)).group_by("pid", "layer").agg(
        pl.col("size_bytes").sum().alias("b")).iter_rows(named=True)}
    # the one figure per holder: pieces held at the instant or in the window
    mine = rec.held.filter(here & (live_at(at_ns) | live_at(start)))
    figures = {int(r["pid"]): r for r in by_holder(mine, at_ns, start).iter_rows(named=True)}
    per_pid = mine.partition_by("pid", as_dict=True)
    pids = set(driver) | {p for p, _ in per_layer} | set(figures) | set(allocator or {})
    # largest first; only the listed ones get their rows and sites
    order = sorted(pids, key=lambda p: (-(driver.get(p) or 0), -(int(figures[p]["held_bytes"])
                                        if p in figures else 0), p))
    listed, rest = order[:MAX_HOLDERS], order[MAX_HOLDERS:]
    left_out = None if not rest else {
        "count": len(rest), "driver_bytes": sum(driver.get(p) or 0 for p in rest),
        "held_bytes": sum(int(figures[p]["held_bytes"]) for p in rest if p in figures)}
    out = []
    for pid in listed:
        f, traced = figures.get(pid), pid in rec.traced
        df = per_pid.get((pid,))
        row: dict[str, Any] = {
            "pid": pid, "comm": rec.comm.get(pid), "traced": traced,
            "driver_bytes": driver.get(pid),
            "held_bytes": (int(f["held_bytes"]) if f else 0) if traced else None,
            "held_by_class": {c: int(f[k]) for c, k in CLASS_KEYS.items() if f[k]}
            if f else {},
            **{f"{layer}_bytes": per_layer.get((pid, layer), 0) if traced
               else None for layer in LAYERS},
            "allocator_reserved_bytes": None, "allocator_allocated_bytes": None,
            "grew_bytes": (int(f["grew_bytes"]) if f else 0) if traced else None,
            "top_sites": [] if df is None else _site_rows(
                rec, pid, df, live_at(at_ns).cast(pl.Int64), n_sites),
            "grew_sites": [] if df is None else [s for s in _site_rows(
                rec, pid, df, gained(start, at_ns), n_sites) if s["bytes"] > 0],
        }
        if allocator is not None and pid in allocator:
            row["allocator_reserved_bytes"], row["allocator_allocated_bytes"] = allocator[pid]
        out.append(row)
    return out, left_out
