"""Is free GPU memory usable, or scattered into pieces too small to serve a 2 MiB chunk?

From RM samples (layer `rm_query`, table `gpu_memory`): per GPU over time, free
memory, the largest free region and the share of free memory that a single
allocation (or one of 2 MiB / 64 MiB / 1 GiB) cannot use; see
gputrace.analyses.gpu_memory. From PMM chunks (layer `driver`), as follows.

PMM chunk events are replayed per GPU: an `alloc` makes [address, address +
2^log2_size) used until the matching `free` (same GPU, address and size, as-of
pairing) or an `evict` of its 2 MiB root chunk; `split`/`merge` only reshape
chunks. At peak usage and at the end of the trace, in [0, memory_bytes) of
the GPU (manifest `gpus[i].memory_bytes`; addresses are taken as offsets into
the GPU's memory):

- free_bytes, largest_free_run_bytes (longest address range with no used chunk);
- unusable_2m_bytes: free bytes inside 2 MiB root chunks that are partly
  used, which no 2 MiB allocation can use;
- partial_root_share: partly used root chunks / root chunks in use;
- fragmentation_index = 1 - largest free run / free bytes (0 = one run).

The same measures are given within each reserved VA range of the API layer
(cuMemAddressReserve, mapped by cuMemMap until cuMemUnmap) at trace end.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from gputrace.analyses import gpu_memory
from gputrace.analyses.helpers.common import (
    BLOCK_2M,
    Inputs,
    chunk_bytes,
    pair,
    records,
    trace_warnings,
)
from gputrace.analyses.report import Report, not_recorded

QUESTION = "Is free GPU memory usable, or scattered into pieces too small for 2 MiB chunks?"
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


def snapshot(iv: pl.LazyFrame, spaces: pl.DataFrame, at: pl.DataFrame) -> pl.LazyFrame:
    """Free-space measures per space at time `at[space]` (spaces: space, lo, hi)."""
    live = (iv.join(at.lazy(), on="space")
            .filter((pl.col("alloc_ts_ns") <= pl.col("t"))
                    & (pl.col("free_ts_ns").is_null() | (pl.col("free_ts_ns") > pl.col("t"))))
            .join(spaces.lazy(), on="space").sort("space", "start")
            .with_columns(run=pl.col("end").cum_max().over("space")))
    gaps = live.with_columns(gap=pl.col("start") - pl.col("run").shift(1).over("space")
                             .fill_null(pl.col("lo")))
    per = gaps.group_by("space").agg(
        pl.col("gap").max().alias("gap"), pl.col("run").max().alias("last"),
        (pl.col("end") - pl.col("start")).sum().alias("used_bytes"))
    roots = (live.with_columns(r=pl.int_ranges((pl.col("start") - pl.col("lo")) // BLOCK_2M,
                                               (pl.col("end") - pl.col("lo") - 1) // BLOCK_2M + 1))
             .explode("r").with_columns(
                 u=pl.min_horizontal("end", pl.col("lo") + (pl.col("r") + 1) * BLOCK_2M)
                 - pl.max_horizontal("start", pl.col("lo") + pl.col("r") * BLOCK_2M))
             .group_by("space", "r").agg(pl.col("u").sum())
             .group_by("space").agg(pl.len().alias("roots_used"),
                                    (pl.col("u") < BLOCK_2M).sum().alias("roots_partial")))
    s = (spaces.lazy().join(at.lazy(), on="space").join(per, on="space", how="left")
         .join(roots, on="space", how="left")
         .with_columns(pl.col("used_bytes", "roots_used", "roots_partial").fill_null(0)))
    free = pl.col("hi") - pl.col("lo") - pl.col("used_bytes")
    largest = pl.max_horizontal(pl.col("gap").fill_null(0),
                                pl.col("hi") - pl.col("last").fill_null(pl.col("lo")))
    usable = ((pl.col("hi") - pl.col("lo")) // BLOCK_2M - pl.col("roots_used")) * BLOCK_2M
    return s.select(
        "space", pl.col("t").alias("ts_ns"), "used_bytes", free.alias("free_bytes"),
        largest.alias("largest_free_run_bytes"),
        pl.max_horizontal(free - usable, 0).alias("unusable_2m_bytes"),
        pl.when(pl.col("roots_used") > 0).then(pl.col("roots_partial") / pl.col("roots_used"))
        .alias("partial_root_share"),
        pl.when(free > 0).then(1 - largest / free).alias("fragmentation_index")).sort("space")


def _peak_times(iv: pl.LazyFrame) -> pl.LazyFrame:
    ev = pl.concat([
        iv.select("space", pl.col("alloc_ts_ns").alias("t"), (pl.col("end") - pl.col("start"))
                  .alias("d")),
        iv.filter(pl.col("free_ts_ns").is_not_null()).select(
            "space", pl.col("free_ts_ns").alias("t"),
            (pl.col("start") - pl.col("end")).alias("d"))])
    return (ev.group_by("space", "t").agg(pl.col("d").sum()).sort("space", "t")
            .with_columns(used=pl.col("d").cum_sum().over("space"))
            .group_by("space").agg(pl.col("t").sort_by("used", descending=True).first()))


def reservations(calls: pl.LazyFrame, end_ns: int) -> pl.LazyFrame:
    """Free-space measures inside each cuMemAddressReserve range alive at trace end."""
    ok = calls.filter(pl.col("result").fill_null(0) == 0).with_columns(
        start=pl.col("ptr").cast(pl.Int64), base=pl.col("func").str.replace(r"_v\d+$", ""))
    rs = pair(ok.filter(pl.col("base") == "cuMemAddressReserve"),
              ok.filter(pl.col("base") == "cuMemAddressFree"), ["pid", "start"])
    res = rs.filter(pl.col("free_ts_ns").is_null()).with_row_index("space").select(
        pl.col("space").cast(pl.Int64), "pid", pl.col("start").alias("lo"),
        (pl.col("start") + pl.col("size_bytes").cast(pl.Int64)).alias("hi")).collect()
    maps = pair(ok.filter(pl.col("base") == "cuMemMap"),
                ok.filter(pl.col("base") == "cuMemUnmap"), ["pid", "start"])
    iv = (maps.join(res.lazy(), on="pid")
          .filter((pl.col("start") >= pl.col("lo")) & (pl.col("start") < pl.col("hi")))
          .select("space", "start", (pl.col("start") + pl.col("size_bytes").cast(pl.Int64))
                  .alias("end"), pl.col("ts_ns").alias("alloc_ts_ns"), "free_ts_ns"))
    return snapshot(iv, res.select("space", "lo", "hi"),
                    res.select("space", pl.lit(end_ns).alias("t"))).join(
        res.lazy().select("space", "pid", pl.col("lo").alias("base"),
                          (pl.col("hi") - pl.col("lo")).alias("size_bytes")), on="space")


def rm_section(inp: Inputs, warnings: list[str]) -> dict[str, Any]:
    """Per GPU from RM samples: the worst sample (highest unusable share), each share
    column's own maximum over the samples (`max`, with `max_at_s`: the per-size shares
    can peak in another sample than the overall one), the last sample, and the series
    (see gputrace.analyses.gpu_memory)."""
    s, bad = pl.collect_all([gpu_memory.samples(inp.scan("gpu_memory"), inp.start_ns),
                             gpu_memory.failed(inp.scan("gpu_memory"))])
    for r in bad.iter_rows(named=True):
        warnings.append(f"fragmentation: {r['samples']} RM memory queries of GPU "
                        f"{r['gpu_index']} failed (status {r['status']:#x}); those samples "
                        "carry no sizes")
    ser = gpu_memory.series(s, inp.end_ns, inp.start_ns)
    gpus = []
    for g in sorted(set(s["gpu_index"].to_list())):
        mine = s.filter(pl.col("gpu_index") == g).drop("gpu_index", "ts_ns")
        worst = mine.sort("unusable_share", "t_s", descending=[True, False],
                          nulls_last=True).head(1)
        cols = [c for c in mine.columns if c.startswith("unusable_share")]
        top = {c: mine.sort(c, "t_s", descending=[True, False], nulls_last=True).head(1)
               for c in cols}
        gpus.append({"gpu_index": g, "samples": mine.height,
                     "heap_size_bytes": mine["heap_size_bytes"].max(),
                     "min_free_bytes": mine["heap_free_bytes"].min(),
                     "min_largest_free_bytes": mine["largest_free_bytes"].min(),
                     "worst": records(worst)[0],
                     "max": {c: records(f.select(c))[0][c] for c, f in top.items()},
                     "max_at_s": {c: records(f.select("t_s"))[0]["t_s"]
                                  for c, f in top.items()},
                     "end": records(mine.tail(1))[0],
                     "series": records(ser.filter(pl.col("gpu_index") == g)
                                       .drop("gpu_index"))})
    return {"alloc_sizes": {k: v for k, v in gpu_memory.ALLOC_SIZES.items()},
            "failed_samples": int(bad["samples"].sum()) if bad.height else 0, "gpus": gpus}


def fragmentation(inp: Inputs) -> Report:
    """The fragmentation report: RM samples (layer rm_query) and PMM chunks (driver)."""
    warnings = trace_warnings(inp)
    rm, pmm = inp.has("rm_query"), inp.has("driver")
    if not rm and not pmm:
        return not_recorded("fragmentation", QUESTION, ["driver", "rm_query"], warnings)
    data: dict[str, Any] = {"rm": rm_section(inp, warnings) if rm else None}
    if pmm:
        data.update(chunk_section(inp, warnings))
    else:
        data.update(gpus=None, reservations=None)
    missing = [x for x, on in (("driver", pmm), ("rm_query", rm)) if not on]
    return Report("fragmentation", QUESTION, True, data, missing, warnings)


def chunk_section(inp: Inputs, warnings: list[str]) -> dict[str, Any]:
    """Per GPU from PMM chunk events: measures at peak use and at the end, size histogram;
    and within reserved VA ranges."""
    iv = chunk_intervals(inp.scan("chunks")).collect().lazy()
    caps = dict(enumerate(inp.gpu_memory_bytes))
    peak_df, hist, seen = pl.collect_all([
        _peak_times(iv),
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
