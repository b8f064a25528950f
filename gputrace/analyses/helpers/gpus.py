"""How much memory is allocated on each GPU over time, and how uneven is it?

Per GPU, peak and final allocated bytes are replayed in time order from PMM
chunk events (driver layer: alloc adds 2^log2_size, free and evict subtract)
or, when the trace has none, from RM allocations whose GPU is known (an
allocation adds its size, its end subtracts it). Imbalance across GPUs is the
max / mean of those bytes (GPUs of the manifest count, with zero bytes).

How much memory a GPU has (`memory_sizes`) is read from the manifest's
`gpus[].memory_bytes` when it gives one, else from the largest RM heap size
sampled for that GPU (`gpu_memory.heap_size_bytes`, layer rm_query); every
report that needs it takes it from there and says which.
"""

from __future__ import annotations

import polars as pl

from gputrace.analyses.helpers.common import chunk_bytes
from gputrace.analyses.helpers.inputs import Inputs

FULL_SHARE = 0.95
MANIFEST = "manifest"
RM_HEAP = "gpu_memory heap"


def memory_sizes(inp: Inputs) -> dict[int, tuple[int, str]]:
    """Each GPU's memory in bytes and where it was read (`MANIFEST` or `RM_HEAP`);
    GPUs of unknown size are absent."""
    out = {g: (b, MANIFEST) for g, b in enumerate(inp.gpu_memory_bytes) if b > 0}
    heap = (inp.scan("gpu_memory")
            .filter((pl.col("status") == 0) & (pl.col("heap_size_bytes") > 0))
            .group_by("gpu_index").agg(pl.col("heap_size_bytes").cast(pl.Int64).max())
            .collect())
    for g, h in heap.iter_rows():
        out.setdefault(int(g), (int(h), RM_HEAP))
    return dict(sorted(out.items()))


def memory_bytes_by_index(inp: Inputs) -> list[int]:
    """GPU memory per GPU index 0..N-1 (`memory_sizes`; 0 where unknown), for the
    trace facts of a report."""
    sizes = memory_sizes(inp)
    n = max(len(inp.gpu_memory_bytes), max(sizes, default=-1) + 1)
    return [sizes[g][0] if g in sizes else 0 for g in range(n)]


def gpu_memory(chunks: pl.LazyFrame) -> pl.LazyFrame:
    """Per GPU: peak and final allocated bytes replayed from PMM chunk events."""
    size = chunk_bytes()
    delta = (pl.when(pl.col("chunk_op") == "alloc").then(size)
             .when(pl.col("chunk_op").is_in(["free", "evict"])).then(-size).otherwise(0))
    # sorted by GPU first: groups kept in that order are the rows in GPU order
    return (chunks.sort("gpu_index", "ts_ns")
            .with_columns(used=delta.cum_sum().over("gpu_index"))
            .group_by("gpu_index", maintain_order=True)
            .agg(pl.col("used").max().alias("peak_bytes"),
                 pl.col("used").last().alias("end_bytes")))


def gpu_table(inp: Inputs, df: pl.DataFrame, source: str) -> dict[str, object]:
    """Per-GPU rows with capacity and share, plus imbalance (max / mean)."""
    cap = memory_sizes(inp)
    idx = {int(g) for g in df["gpu_index"]} | set(cap) | set(range(len(inp.gpu_memory_bytes)))
    rows = []
    for g in sorted(idx):
        hit = df.filter(pl.col("gpu_index") == g)
        peak = int(hit["peak_bytes"][0]) if hit.height else 0
        end = int(hit["end_bytes"][0]) if hit.height else 0
        total, src = cap.get(g, (None, None))
        rows.append({"gpu_index": g, "peak_bytes": peak, "end_bytes": end,
                     "memory_bytes": total, "memory_source": src,
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
