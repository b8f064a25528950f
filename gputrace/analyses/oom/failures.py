"""Which allocations failed for want of memory, and which of them are one incident?

Every layer's "no memory" rows (the rule is `gputrace.oom_rules`'s), then two
foldings:
- a failure seen by two layers is one: the RM or UVM failures a failed cuMemAlloc
  made inside its own call (same pid and thread, between its entry and its return)
  are its evidence (`nested`), and they name its GPU when they say which; an
  allocator `oom` entry of a process whose API or RM failure returned within
  `RETRY_GAP_NS` before it is that failure's;
- a retry loop is one incident: failures of one pid, layer, call site (stack, else
  call) and size, each within `RETRY_GAP_NS` of the one before (PyTorch frees its cache
  and retries once), with their count (`attempts`).
Failures are rare, so after the vectorized filter they are handled as Python rows.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from gputrace import oom_rules, schema
from gputrace.analyses.helpers.inputs import Inputs

RETRY_GAP_NS = 1_000_000_000
"""Failures of one call site and size closer than this are one retry loop."""

Row = dict[str, Any]


def _api(inp: Inputs) -> pl.LazyFrame:
    func = pl.col("func")
    return (inp.scan("cuda_calls")
            .filter((pl.col("result") == oom_rules.CUDA_ERROR_OUT_OF_MEMORY)
                    & func.str.starts_with(oom_rules.OOM_CUDA_PREFIX)
                    & ~func.str.starts_with(oom_rules.OOM_CUDA_HOST))
            .select("ts_ns", (pl.col("ts_ns") + pl.col("latency_ns").fill_null(0))
                    .alias("end_ns"), "pid", "tid", "comm", pl.lit("api").alias("layer"),
                    func.alias("call"), pl.col("result").cast(pl.Int64).alias("status"),
                    pl.lit(None, pl.Int16).alias("gpu_index"), "size_bytes", "stack_id",
                    pl.lit(None, pl.UInt64).alias("device_free_bytes")))


def _syscall(inp: Inputs) -> pl.LazyFrame:
    uvm = pl.col("device_code") == schema.DEV_UVM
    return (inp.scan("ioctls")
            .filter((pl.col("status") == oom_rules.NV_ERR_NO_MEMORY)
                    & (uvm | pl.col("name").is_in(list(oom_rules.RM_ALLOC_CALLS))))
            .select("ts_ns", (pl.col("ts_ns") + pl.col("latency_ns").fill_null(0))
                    .alias("end_ns"), "pid", "tid", "comm",
                    pl.when(uvm).then(pl.lit("uvm")).otherwise(pl.lit("rm")).alias("layer"),
                    pl.col("name").alias("call"), pl.col("status").cast(pl.Int64),
                    "gpu_index", "size_bytes", pl.lit(None, pl.Int64).alias("stack_id"),
                    pl.lit(None, pl.UInt64).alias("device_free_bytes")))


def _allocator(inp: Inputs) -> pl.LazyFrame:
    return (inp.scan("allocator_events").filter(pl.col("action") == oom_rules.ALLOCATOR_OOM)
            .select("ts_ns", pl.col("ts_ns").alias("end_ns"), "pid",
                    pl.lit(None, pl.Int32).alias("tid"), pl.lit(None, pl.String).alias("comm"),
                    pl.lit("allocator").alias("layer"), pl.lit("oom").alias("call"),
                    pl.lit(None, pl.Int64).alias("status"),
                    pl.col("device").cast(pl.Int16).alias("gpu_index"), "size_bytes",
                    "stack_id", "device_free_bytes"))


def failed_rows(inp: Inputs) -> list[Row]:
    """Every "no memory" failure of the recorded layers, in time order."""
    parts = []
    if inp.has("api"):
        parts.append(_api(inp))
    if inp.has("syscall"):
        parts.append(_syscall(inp))
    if inp.has("allocator"):
        parts.append(_allocator(inp))
    if not parts:
        return []
    cols = {"ts_ns": pl.Int64, "end_ns": pl.Int64, "pid": pl.Int32, "tid": pl.Int32,
            "comm": pl.String, "layer": pl.String, "call": pl.String, "status": pl.Int64,
            "gpu_index": pl.Int16, "size_bytes": pl.UInt64, "stack_id": pl.Int64,
            "device_free_bytes": pl.UInt64}
    frames = pl.collect_all([p.select(pl.col(c).cast(t) for c, t in cols.items())
                             for p in parts])
    rows: list[Row] = pl.concat(frames).sort("ts_ns", "pid").to_dicts()
    return rows


def _inside(rm: Row, api: Row) -> bool:
    return bool(rm["pid"] == api["pid"] and rm["tid"] == api["tid"]
            and api["ts_ns"] <= rm["ts_ns"] <= api["end_ns"])


def _fold_layers(rows: list[Row]) -> list[Row]:
    """Each failure once: nested RM/UVM failures and a following allocator entry become
    the evidence of the failure they belong to."""
    apis = [r for r in rows if r["layer"] == "api"]
    out: list[Row] = []
    for r in rows:
        r.setdefault("nested", [])
        r.setdefault("allocator_entry", None)
        if r["layer"] in ("rm", "uvm"):
            owner = next((a for a in apis if _inside(r, a)), None)
            if owner is not None:
                owner.setdefault("nested", []).append(r)
                if owner["gpu_index"] is None and r["gpu_index"] is not None:
                    owner["gpu_index"], owner["gpu_from"] = r["gpu_index"], "nested"
                continue
        if r["layer"] == "allocator":
            owner = next((o for o in reversed(out) if o["pid"] == r["pid"]
                          and 0 <= r["ts_ns"] - o["end_ns"] <= RETRY_GAP_NS), None)
            if owner is not None and owner["allocator_entry"] is None:
                owner["allocator_entry"] = r
                if owner["gpu_index"] is None and r["gpu_index"] is not None:
                    # the caching allocator's entry names its device
                    owner["gpu_index"], owner["gpu_from"] = r["gpu_index"], "allocator"
                continue
        r.setdefault("gpu_from", None if r["gpu_index"] is None else "call")
        out.append(r)
    return out


def _site(r: Row) -> tuple[Any, ...]:
    return (r["pid"], r["layer"], r["stack_id"] if r["stack_id"] is not None else r["call"],
            r["size_bytes"])


def incidents(inp: Inputs) -> list[Row]:
    """The incidents of a trace: failures folded across layers, retry loops grouped
    (`attempts`, `last_ts_ns`), each on the GPU it names, or the trace's only GPU."""
    groups: list[Row] = []
    last: dict[tuple[Any, ...], Row] = {}
    for r in _fold_layers(failed_rows(inp)):
        key = _site(r)
        g = last.get(key)
        if g is not None and r["ts_ns"] - g["last_ts_ns"] <= RETRY_GAP_NS:
            g["attempts"] += 1
            g["last_ts_ns"] = r["ts_ns"]
            g["nested"] += r["nested"]
            g["allocator_entry"] = g["allocator_entry"] or r["allocator_entry"]
            continue
        r["attempts"], r["last_ts_ns"] = 1, r["ts_ns"]
        last[key] = r
        groups.append(r)
    only = _only_gpu(inp)
    for g in groups:
        if g["gpu_index"] is None and only is not None:
            g["gpu_index"], g["gpu_from"] = only, "only GPU"
    return groups


def _only_gpu(inp: Inputs) -> int | None:
    """The trace's GPU when it has exactly one (by the manifest, else the samples)."""
    if len(inp.gpu_memory_bytes) == 1:
        return 0
    if inp.gpu_memory_bytes:
        return None
    seen = inp.scan("gpu_memory").select(pl.col("gpu_index").unique()).collect()
    return int(seen["gpu_index"][0]) if seen.height == 1 else None
