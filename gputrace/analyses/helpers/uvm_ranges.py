"""When was each UVM range made and when did it end: managed mmaps, external
mappings (memory) and external range reservations (address space, layer
`uvm-virtual`, never memory)? The `uvm` layer of helpers.lifetimes.
"""

from __future__ import annotations

import polars as pl

from gputrace.analyses.helpers.common import ok_ioctl
from gputrace.analyses.helpers.pairing import pair

UVM_RESERVE = "UVM_CREATE_EXTERNAL_RANGE"


UVM_MAP = "UVM_MAP_EXTERNAL_ALLOCATION"


UVM_CLOSES = ("UVM_FREE", "UVM_UNMAP_EXTERNAL")


UVM_VIRTUAL_LAYER = "uvm-virtual"


MANAGED, EXTERNAL = "managed mmap", "external range"
"""The `what` of the two kinds of UVM mapping (memory, layer `uvm`)."""


def _external(ioctls: pl.LazyFrame) -> pl.LazyFrame:
    """External mappings (memory) and external ranges (reservations, layer uvm-virtual).

    UVM_CREATE_EXTERNAL_RANGE reserves address space; UVM_MAP_EXTERNAL_ALLOCATION maps
    an RM memory object (hClient, hMemory) into it: only the mapping is memory. Either
    ends at an UVM_FREE or UVM_UNMAP_EXTERNAL of its base; a mapping also ends when the
    range holding it is freed. Consecutive opens of one base are one allocation.
    """
    ev = (ioctls.filter(ok_ioctl() & pl.col("name").is_in([UVM_RESERVE, UVM_MAP, *UVM_CLOSES]))
          .with_columns(reserve=pl.col("name") == UVM_RESERVE)
          .with_columns(opens=pl.col("name").is_in([UVM_RESERVE, UVM_MAP])))

    def one(reserve: bool) -> pl.LazyFrame:
        # a range ends at UVM_FREE; a mapping at UVM_FREE or UVM_UNMAP_EXTERNAL
        kind = (ev.filter(pl.col("reserve") | (pl.col("name") == "UVM_FREE")) if reserve
                else ev.filter(~pl.col("reserve")))
        kind = kind.sort("ts_ns").with_columns(
            first=pl.col("opens") & ~pl.col("opens").shift(1).over(["pid", "va_base"])
            .fill_null(False))
        return pair(kind.filter("first"), kind.filter(~pl.col("opens")), ["pid", "va_base"])

    cols = ["pid", "tid", "comm", "ts_ns", "latency_ns", "free_ts_ns", "va_base",
            "va_length", "h_client", "h_object"]
    res = one(True).select(cols)
    maps = one(False).select(cols)
    # A mapping inside a range ends with the range: the range with the highest base at
    # or below the mapping's, when it covers the mapping and lived when it was made.
    rng = res.select("pid", pl.col("va_base").alias("_rb"), pl.col("va_length").alias("_rl"),
                     pl.col("ts_ns").alias("_rt"), pl.col("free_ts_ns").alias("_rf"))
    maps = (maps.sort("va_base").join_asof(rng.sort("_rb"), left_on="va_base", right_on="_rb",
                                           by="pid", strategy="backward",
                                           check_sortedness=False)
            .with_columns(free_ts_ns=pl.min_horizontal("free_ts_ns", pl.when(
                (pl.col("va_base") < pl.col("_rb") + pl.col("_rl")) & (pl.col("_rt") <= pl.col(
                    "ts_ns")) & (pl.col("_rf") >= pl.col("ts_ns"))).then("_rf")))
            .select(cols))
    return pl.concat([
        maps.with_columns(layer=pl.lit("uvm"), what=pl.lit(EXTERNAL)),
        res.with_columns(layer=pl.lit(UVM_VIRTUAL_LAYER), h_client=pl.lit(None, pl.UInt32),
                         h_object=pl.lit(None, pl.UInt32),
                         what=pl.lit("external range reservation"))])


def uvm_lifetimes(ioctls: pl.LazyFrame, mappings: pl.LazyFrame) -> pl.LazyFrame:
    """Managed mmaps (ended by munmap), external mappings and, as layer uvm-virtual,
    external range reservations (ended by UVM_FREE/UNMAP)."""
    mm = mappings.filter(pl.col("managed").fill_null(False) & (pl.col("op_code") == 1)
                         & (pl.col("ret").fill_null(0) >= 0))
    # Any successful munmap at the address ends the range mapped there: the
    # recorder cannot always say a munmap was of a managed range.
    un = mappings.filter((pl.col("op_code") == 2) & (pl.col("ret").fill_null(0) == 0))
    managed = pair(mm, un, ["pid", "addr"]).select(
        "pid", "tid", "comm", "ts_ns", "latency_ns", "free_ts_ns",
        pl.col("addr").alias("va_base"), pl.col("length").alias("va_length"),
        pl.lit(None, pl.UInt32).alias("h_client"), pl.lit(None, pl.UInt32).alias("h_object"),
        layer=pl.lit("uvm"), what=pl.lit(MANAGED))
    both = pl.concat([managed, _external(ioctls)], how="vertical_relaxed")
    return both.select(
        "layer", "pid", "comm", pl.col("va_base").alias("id"), "what",
        pl.col("va_length").alias("size_bytes"), pl.col("ts_ns").alias("alloc_ts_ns"),
        "free_ts_ns",
        pl.when(pl.col("free_ts_ns").is_not_null()).then(pl.lit("free")).alias("freed_by"),
        pl.lit(None, pl.Int64).alias("stack_id"), pl.lit(None, pl.Int16).alias("gpu_index"),
        "tid", (pl.col("ts_ns") + pl.col("latency_ns").fill_null(0)).alias("call_end_ns"),
        pl.col("h_client").alias("client"), pl.col("h_object").alias("handle"),
    )
