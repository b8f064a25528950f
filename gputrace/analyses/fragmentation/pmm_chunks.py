"""How fragmented is each GPU's memory by its PMM chunks, at peak use and at the end?

PMM chunk events are replayed per GPU: an `alloc` makes [address, address +
2^log2_size) used until the matching `free` (same GPU, address and size, as-of
pairing) or an `evict` of its 2 MiB root chunk; `split`/`merge` only reshape
chunks. At peak usage and at the end of the trace, in [0, memory_bytes) of
the GPU (manifest `gpus[i].memory_bytes`; addresses are taken as offsets into
the GPU's memory), the measures of free_space. Part of the fragmentation report.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from gputrace.analyses.fragmentation.free_space import peak_times, snapshot
from gputrace.analyses.fragmentation.va_reservations import reservations
from gputrace.analyses.helpers.common import BLOCK_2M, chunk_bytes, records
from gputrace.analyses.helpers.inputs import Inputs
from gputrace.analyses.helpers.pairing import pair

SIZES = {12: "4KiB", 16: "64KiB", 21: "2MiB"}


def chunk_intervals(chunks: pl.LazyFrame) -> pl.LazyFrame:
    """(space=gpu_index, start, end, alloc_ts_ns, free_ts_ns) of every allocated chunk."""
    size = chunk_bytes()
    c = chunks.with_columns(start=pl.col("address").cast(pl.Int64), size=size)
    allocs = c.filter(pl.col("chunk_op") == "alloc")
    freed = pair(allocs, c.filter(pl.col("chunk_op") == "free"),
                 ["gpu_index", "start", "size"])
    ev = (c.filter(pl.col("chunk_op") == "evict").select(
        "gpu_index", (pl.col("start") // BLOCK_2M).alias("root"), pl.col("ts_ns").alias("ev"))
        .sort("ev"))
    freed = (freed.with_columns(root=pl.col("start") // BLOCK_2M).sort("ts_ns")
             .join_asof(ev, left_on="ts_ns", right_on="ev", by=["gpu_index", "root"],
                        strategy="forward", check_sortedness=False))
    return freed.select(pl.col("gpu_index").cast(pl.Int64).alias("space"), "start",
                        (pl.col("start") + pl.col("size")).alias("end"),
                        pl.col("ts_ns").alias("alloc_ts_ns"),
                        pl.min_horizontal("free_ts_ns", "ev").alias("free_ts_ns"))


def chunk_section(inp: Inputs, warnings: list[str]) -> dict[str, Any]:
    """Per GPU from PMM chunk events: measures at peak use and at the end, size histogram;
    and within reserved VA ranges."""
    iv = chunk_intervals(inp.scan("chunks")).collect().lazy()
    caps = dict(enumerate(inp.gpu_memory_bytes))
    peak_df, hist, seen = pl.collect_all([
        peak_times(iv),
        inp.scan("chunks").filter(pl.col("chunk_op") == "alloc").group_by(
            "gpu_index", pl.col("log2_size").replace_strict(SIZES, default="other")
            .alias("size")).agg(pl.len()),
        iv.group_by("space").agg(pl.col("end").max())])
    spaces = []
    for g, hi in zip(seen["space"], seen["end"], strict=True):
        if not caps.get(g):
            warnings.append(f"fragmentation: GPU {g} memory size not in the manifest; "
                            "using the highest chunk address seen")
        spaces.append({"space": g, "lo": 0, "hi": caps.get(g) or -(-hi // BLOCK_2M) * BLOCK_2M})
    sp = pl.DataFrame(spaces, schema={"space": pl.Int64, "lo": pl.Int64, "hi": pl.Int64})
    end_at = sp.select("space", pl.lit(inp.end_ns).alias("t"))
    peak, end, res = pl.collect_all([snapshot(iv, sp, peak_df), snapshot(iv, sp, end_at),
                                     reservations(inp.scan("cuda_calls"), inp.end_ns)])
    gpus = []
    for row in sp.iter_rows(named=True):
        g = row["space"]
        pick = {n: records(f.filter(pl.col("space") == g).drop("space"))
                for n, f in (("peak", peak), ("end", end))}
        h = {n: int(hist.filter((pl.col("gpu_index") == g) & (pl.col("size") == n))["len"]
                    .sum()) for n in [*SIZES.values(), "other"]}
        gpus.append({"gpu_index": g, "memory_bytes": row["hi"] - row["lo"],
                     "peak": pick["peak"][0] if pick["peak"] else None,
                     "end": pick["end"][0] if pick["end"] else None, "histogram": h})
    return {"gpus": gpus, "reservations": records(res.drop("space")) if inp.has("api") else None}
