"""Units and the small polars expressions every analysis shares: which ioctl
succeeded, a PMM chunk's bytes, size classes, quantiles, JSON-ready rows.
"""

from __future__ import annotations

from typing import Any

import polars as pl

MiB = 1 << 20


BLOCK_2M = 2 * MiB


NS_PER_S = 1_000_000_000


NS_PER_MIN = 60 * NS_PER_S


def ok_ioctl() -> pl.Expr:
    """An ioctl that succeeded: NV_OK status (or none) and a non-negative return."""
    return (pl.col("status").fill_null(0) == 0) & (pl.col("ret").fill_null(0) >= 0)


def chunk_bytes() -> pl.Expr:
    """Bytes of a PMM chunk: 2 ** log2_size."""
    return pl.lit(2, pl.Int64).pow(pl.col("log2_size").cast(pl.UInt32))


def size_class(col: str = "size_bytes") -> pl.Expr:
    """Readable size class: the power-of-two bucket a size falls in."""
    s = pl.col(col).cast(pl.Int64)
    return (
        pl.when(s <= 4096).then(pl.lit("<=4KiB"))
        .when(s <= 64 * 1024).then(pl.lit("<=64KiB"))
        .when(s <= BLOCK_2M).then(pl.lit("<=2MiB"))
        .when(s <= 32 * MiB).then(pl.lit("<=32MiB"))
        .when(s <= 512 * MiB).then(pl.lit("<=512MiB"))
        .otherwise(pl.lit(">512MiB"))
    )


def records(df: pl.DataFrame) -> list[dict[str, Any]]:
    """A frame as JSON-ready rows (floats rounded so output is stable)."""
    out = df.with_columns(pl.col(pl.Float64, pl.Float32).round(6)).to_dicts()
    return out


def quantiles(col: str, prefix: str = "") -> list[pl.Expr]:
    """Exact p50/p90/p99 and max of a column (as nsys stats reports them)."""
    c = pl.col(col)
    return [
        c.quantile(0.5, "nearest").alias(f"{prefix}p50"),
        c.quantile(0.9, "nearest").alias(f"{prefix}p90"),
        c.quantile(0.99, "nearest").alias(f"{prefix}p99"),
        c.max().alias(f"{prefix}max"),
    ]
