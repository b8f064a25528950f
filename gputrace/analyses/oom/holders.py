"""Who held the GPU when an allocation failed, and what grew before it?

One row per process, keyed by pid (identity columns join on it): the driver's own
accounting (every process RM names, traced or not) beside what gputrace recorded
for it (live bytes per layer at the instant, from the allocation lifetimes the leak
report reads), its top live allocation sites with their stacks, and what it gained
over the window before the failure (live bytes at the instant minus live bytes at
the window's start, per process and per site). Recorded allocations whose GPU is not
known (the API layer names none) count on every GPU of the question; host memory
(cuMemAllocHost, cuMemHostAlloc, RM system-memory objects) holds none of a GPU's and
is left out.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from gputrace.analyses.helpers.inputs import Inputs
from gputrace.analyses.helpers.lifetimes import lifetimes, memory
from gputrace.analyses.helpers.stacks import stack_frames
from gputrace.nvabi import MEMORY_CLASSES, NV01_MEMORY_SYSTEM, NV01_MEMORY_SYSTEM_OS_DESCRIPTOR

LAYERS = ("api", "rm", "uvm")
HOST_MEMORY = ("cuMemAllocHost", "cuMemHostAlloc",
               *(f"{MEMORY_CLASSES[c]} 0x{c:X}"
                 for c in (NV01_MEMORY_SYSTEM, NV01_MEMORY_SYSTEM_OS_DESCRIPTOR)))
"""`what` of the lifetime rows that are host memory (labels as rm_objects writes them)."""
SITES = 3
"""Top live sites listed per holder (unless --top says fewer)."""


class Recorded:
    """The trace's memory lifetimes, stacks and traced pids, read once for every
    incident of a report."""

    def __init__(self, inp: Inputs) -> None:
        self.inp = inp if inp.has("api") else None
        lt = memory(lifetimes(inp)).select(
            "layer", "pid", "comm", "what", "size_bytes", "alloc_ts_ns", "free_ts_ns",
            "stack_id", "gpu_index").filter(~pl.col("what").is_in(list(HOST_MEMORY)))
        self._stacks: dict[tuple[int, int], tuple[str, str] | None] = {}
        procs = inp.scan("processes").select("pid", "comm")
        # traced: the trace holds an event of it (a process the recorder only listed,
        # one that held the device open before the recording, is not)
        seen = [inp.scan(n).select("pid").unique() for n, layer in (
            ("cuda_calls", "api"), ("ioctls", "syscall"), ("mappings", "syscall"),
            ("allocator_events", "allocator")) if inp.has(layer)]
        self.lt, names, *pids = pl.collect_all([lt, procs, *seen])
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


def _site_rows(rec: Recorded, pid: int, df: pl.DataFrame, top: int) -> list[dict[str, Any]]:
    """One process's bytes by (layer, what, stack), largest first, the first `top`."""
    sites = (df.group_by("layer", "what", "stack_id")
             .agg(pl.col("size_bytes").sum().alias("bytes"), pl.col("n").sum().alias("count"))
             .filter(pl.col("bytes") != 0)
             .sort(["bytes", "layer", "what", "stack_id"], descending=[True, False, False, False],
                   nulls_last=True).head(top))
    return [{"layer": r["layer"], "what": r["what"], "stack": rec.stack(pid, r["stack_id"]),
             "site": rec.stack(pid, r["stack_id"], "site"),
             "bytes": int(r["bytes"]), "count": int(r["count"])}
            for r in sites.iter_rows(named=True)]


def holders(rec: Recorded, gpu: int, at_ns: int, window_ns: int,
            driver: dict[int, int | None], allocator: dict[int, tuple[int, int]] | None,
            top: int | None) -> list[dict[str, Any]]:
    """Every process holding memory on `gpu` at `at_ns`, by the driver or by the trace,
    largest first (driver bytes, then recorded bytes)."""
    n_sites = min(SITES, top) if top is not None else SITES
    start = at_ns - window_ns
    on_gpu = rec.lt.filter(pl.col("gpu_index").is_null() | (pl.col("gpu_index") == gpu))
    live = on_gpu.filter(_live(at_ns)).with_columns(pl.lit(1).alias("n"))
    # window growth: + size if live at the instant, - size if live at the window's start
    n = (_live(at_ns).cast(pl.Int64) - _live(start).cast(pl.Int64))
    grew = on_gpu.with_columns((pl.col("size_bytes") * n).alias("size_bytes"), n.alias("n"))
    per_layer = {(int(r["pid"]), r["layer"]): int(r["b"]) for r in live.group_by(
        "pid", "layer").agg(pl.col("size_bytes").sum().alias("b")).iter_rows(named=True)}
    gained = {int(r["pid"]): int(r["b"]) for r in grew.group_by("pid").agg(
        pl.col("size_bytes").sum().alias("b")).iter_rows(named=True)}
    pids = set(driver) | {p for p, _ in per_layer} | set(allocator or {})
    out = []
    for pid in pids:
        row: dict[str, Any] = {
            "pid": pid, "comm": rec.comm.get(pid), "traced": pid in rec.traced,
            "driver_bytes": driver.get(pid),
            **{f"{layer}_bytes": per_layer.get((pid, layer), 0) if pid in rec.traced
               else None for layer in LAYERS},
            "allocator_reserved_bytes": None, "allocator_allocated_bytes": None,
            "grew_bytes": gained.get(pid, 0) if pid in rec.traced else None,
            "top_sites": _site_rows(rec, pid, live.filter(pl.col("pid") == pid), n_sites),
            "grew_sites": [s for s in _site_rows(rec, pid, grew.filter(pl.col("pid") == pid),
                                                 n_sites) if s["bytes"] > 0],
        }
        if allocator is not None and pid in allocator:
            row["allocator_reserved_bytes"], row["allocator_allocated_bytes"] = allocator[pid]
        out.append(row)
    recorded = [max((r[f"{la}_bytes"] or 0) for la in LAYERS) for r in out]
    order = sorted(range(len(out)), key=lambda i: (-(out[i]["driver_bytes"] or 0),
                                                   -recorded[i], out[i]["pid"]))
    return [out[i] for i in order]
