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
    cols = allocs.collect_schema()
    # `_t` = time*2 + is_free orders an allocation before a free at the same time and
    # carries both, so the sorts below move one column fewer than time and a flag.
    f = frees.drop_nulls(by).select(*by, _t=pl.col("ts_ns").cast(pl.Int64) * 2 + 1)
    a = allocs.with_columns(_t=pl.col("ts_ns").cast(pl.Int64) * 2).drop("ts_ns")
    both = pl.concat([a, f], how="diagonal_relaxed")
    # (key, time, allocation first) as two single-column sorts: by `_t` (cheap: rows
    # come nearly in time order), then a stable sort by a 64-bit hash of the key. A
    # multi-column sort, or one on expressions rather than columns, costs 2-3x more;
    # `nxt` below still compares the real key.
    both = (both.sort("_t").with_columns(_h=pl.struct(by).hash())
            .sort("_h", maintain_order=True))
    nxt = pl.col("_t").shift(-1) % 2 == 1
    for k in by:
        nxt = nxt & (pl.col(k) == pl.col(k).shift(-1))
    return (both.with_columns(free_ts_ns=pl.when(nxt.fill_null(False))
                              .then(pl.col("_t").shift(-1) // 2),
                              ts_ns=(pl.col("_t") // 2).cast(cols["ts_ns"]))
            .filter(pl.col("_t") % 2 == 0).select(*cols.names(), "free_ts_ns"))
