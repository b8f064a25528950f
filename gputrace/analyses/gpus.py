"""How much memory is allocated on each GPU over time, and how uneven is it?

Per GPU, peak and final allocated bytes are replayed in time order from PMM
chunk events (driver layer: alloc adds 2^log2_size, free and evict subtract)
or, when the trace has none, from RM allocations whose GPU is known (an
allocation adds its size, its end subtracts it). Imbalance across GPUs is the
max / mean of those bytes (GPUs of the manifest count, with zero bytes).
"""

from __future__ import annotations

import polars as pl

from gputrace.analyses.common import Inputs, chunk_bytes

FULL_SHARE = 0.95


def gpu_memory(chunks: pl.LazyFrame) -> pl.LazyFrame:
    """Per GPU: peak and final allocated bytes replayed from PMM chunk events."""
    size = chunk_bytes()
    delta = (pl.when(pl.col("chunk_op") == "alloc").then(size)
             .when(pl.col("chunk_op").is_in(["free", "evict"])).then(-size).otherwise(0))
    return (chunks.sort("gpu_index", "ts_ns")
            .with_columns(used=delta.cum_sum().over("gpu_index"))
            .group_by("gpu_index").agg(pl.col("used").max().alias("peak_bytes"),
                                       pl.col("used").last().alias("end_bytes"))
            .sort("gpu_index"))


def gpu_table(inp: Inputs, df: pl.DataFrame, source: str) -> dict[str, object]:
    """Per-GPU rows with capacity and share, plus imbalance (max / mean)."""
    cap = dict(enumerate(inp.gpu_memory_bytes))
    idx = {int(g) for g in df["gpu_index"]} | set(cap)
    rows = []
    for g in sorted(idx):
        hit = df.filter(pl.col("gpu_index") == g)
        peak = int(hit["peak_bytes"][0]) if hit.height else 0
        end = int(hit["end_bytes"][0]) if hit.height else 0
        total = cap.get(g) or None
        rows.append({"gpu_index": g, "peak_bytes": peak, "end_bytes": end,
                     "memory_bytes": total,
                     "peak_share": round(peak / total, 6) if total else None,
                     "full": bool(total and peak >= FULL_SHARE * total)})

    def imbalance(col: str) -> float | None:
        vals = [float(r[col]) for r in rows]  # type: ignore[arg-type]
        mean = sum(vals) / len(vals) if vals else 0.0
        return round(max(vals) / mean, 6) if mean > 0 else None

    return {"source": source, "gpus": rows, "imbalance_peak": imbalance("peak_bytes"),
            "imbalance_end": imbalance("end_bytes")}


def pmm_gpus(inp: Inputs) -> pl.DataFrame | None:
    """Per-GPU memory from PMM chunk events; None when there are none (driver layer
    not recorded or empty), so RM allocations with a known GPU stand in."""
    if not inp.has("driver"):
        return None
    df = gpu_memory(inp.scan("chunks")).collect()
    return df if df.height else None


def replay_steps(steps: pl.DataFrame) -> pl.DataFrame:
    """Per GPU: peak and final bytes of (gpu_index, ts_ns, d) steps replayed in time order."""
    return (steps.sort("gpu_index", "ts_ns")
            .with_columns(used=pl.col("d").cum_sum().over("gpu_index"))
            .group_by("gpu_index").agg(pl.col("used").max().alias("peak_bytes"),
                                       pl.col("used").last().alias("end_bytes")))
