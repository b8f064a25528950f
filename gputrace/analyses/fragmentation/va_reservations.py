"""How fragmented is each reserved VA range at the end of the trace?

Ranges reserved by cuMemAddressReserve (API layer), mapped by cuMemMap until
cuMemUnmap; the measures of free_space at trace end. Part of the fragmentation
report.
"""

from __future__ import annotations

import polars as pl

from gputrace.analyses.fragmentation.free_space import snapshot
from gputrace.analyses.helpers.pairing import pair


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
