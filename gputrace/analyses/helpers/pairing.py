"""Which free ends which allocation? As-of pairing of allocation and free rows on a key.
"""

from __future__ import annotations

import polars as pl


def pair(allocs: pl.LazyFrame, frees: pl.LazyFrame, by: list[str]) -> pl.LazyFrame:
    """`allocs` (with `ts_ns`) plus `free_ts_ns`, paired on the key columns `by`.

    As-of semantics: each free matches the latest allocation of its key at or
    before it, and an allocation keeps the first free that matched it. With
    allocations and frees sorted together by (key, time, allocation first), that
    is: an allocation's free is the next row, when the next row is a free of the
    same key. Two sorts, no join.
    """
    f = frees.select(*by, "ts_ns").drop_nulls(by).with_columns(_free=pl.lit(True))
    both = pl.concat([allocs.with_columns(_free=pl.lit(False)), f], how="diagonal_relaxed")
    # (key, time, allocation first) as two single-column sorts: by time*2 + is_free
    # (cheap: rows come nearly in time order), then a stable sort by a 64-bit hash of
    # the key. A multi-column sort, or one on expressions rather than columns, costs
    # 2-3x more; `same` below still compares the real key.
    both = (both.with_columns(_t=pl.col("ts_ns") * 2 + pl.col("_free").cast(pl.Int64))
            .sort("_t").with_columns(_h=pl.struct(by).hash())
            .sort("_h", maintain_order=True))
    same = pl.lit(True)
    for k in by:
        same = same & (pl.col(k) == pl.col(k).shift(-1)).fill_null(False)
    nxt = pl.col("_free").shift(-1).fill_null(False) & same
    return (both.with_columns(free_ts_ns=pl.when(nxt).then(pl.col("ts_ns").shift(-1)))
            .filter(~pl.col("_free")).drop("_free", "_t", "_h"))
