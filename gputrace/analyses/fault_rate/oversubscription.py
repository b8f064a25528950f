"""Is more managed memory in use than the GPUs hold?

Peak live managed bytes (managed mmaps, else cuMemAllocManaged) against all
GPUs' memory, and managed bytes estimated resident on each GPU against that
GPU's memory (the manifest's size, else the RM heap size sampled). Part of the
fault-rate report.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from gputrace.analyses.helpers.common import NS_PER_S
from gputrace.analyses.helpers.gpus import memory_sizes
from gputrace.analyses.helpers.inputs import Inputs
from gputrace.analyses.helpers.lifetimes import api_lifetimes
from gputrace.analyses.helpers.uvm_ranges import MANAGED, uvm_lifetimes
from gputrace.analyses.leaks.growth import live_series


def managed_peak(inp: Inputs) -> tuple[int, str] | None:
    """Peak live managed bytes across processes, and where it was read from."""
    if inp.has("syscall"):
        lt = uvm_lifetimes(inp.scan("ioctls"), inp.scan("mappings")).filter(
            pl.col("what") == MANAGED)
        source = "managed mmaps"
    elif inp.has("api"):
        lt = api_lifetimes(inp.scan("cuda_calls")).filter(pl.col("what") == "cuMemAllocManaged")
        source = "cuMemAllocManaged"
    else:
        return None
    s = live_series(lt.with_columns(pid=pl.lit(0, pl.Int32),
                                    size_bytes=pl.col("size_bytes").cast(pl.Int64))).collect()
    return (int(s["live_bytes"].max() or 0), source) if s.height else None  # type: ignore[arg-type]


def oversubscription(inp: Inputs, resident_df: pl.DataFrame | None) -> dict[str, Any] | None:
    """Managed memory against GPU memory: the managed address space (syscall or API
    layer) against all GPUs, and the bytes estimated resident on each GPU
    (`migrations.resident`) against that GPU's memory (`gpus.memory_sizes`: the
    manifest's size, else the RM heap size sampled; `memory_source` says which)."""
    peak = managed_peak(inp)
    sizes = memory_sizes(inp)
    total_mem = sum(b for b, _ in sizes.values())
    per_gpu = []
    for r in resident_df.iter_rows(named=True) if resident_df is not None else ():
        mem, src = sizes.get(r["gpu_index"], (None, None))
        ratio = round(r["resident_peak_bytes"] / mem, 6) if mem else None
        at = r.pop("peak_ts_ns")
        peak_s = round((at - inp.start_ns) / NS_PER_S, 6) if r["resident_peak_bytes"] else None
        per_gpu.append({**r, "peak_s": peak_s, "gpu_memory_bytes": mem,
                        "memory_source": src, "ratio": ratio})
    if peak is None and resident_df is None:
        return None
    out: dict[str, Any] = {"managed_peak_bytes": None, "gpu_memory_bytes": total_mem or None,
                           "gpu_memory_source": sorted({s for _, s in sizes.values()}) or None,
                           "gpus_of_unknown_memory": _unknown_gpus(inp, sizes),
                           "ratio": None, "oversubscribed": None, "source": None}
    if peak is not None:
        ratio = peak[0] / total_mem if total_mem else None
        out.update(managed_peak_bytes=peak[0], ratio=ratio,
                   oversubscribed=bool(ratio and ratio > 1.0), source=peak[1])
    out["resident_by_gpu"] = per_gpu if resident_df is not None else None
    return out


def _unknown_gpus(inp: Inputs, sizes: dict[int, tuple[int, str]]) -> list[int]:
    """Manifest GPUs whose memory neither the manifest nor an RM sample gives: the
    ratio against all GPUs' memory is then too high."""
    return [g for g in range(len(inp.gpu_memory_bytes)) if g not in sizes]
