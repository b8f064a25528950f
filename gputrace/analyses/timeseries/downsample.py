"""How is a series of a 100 M-event trace cut to few enough points to plot?

Plots of a 100 M-event trace cannot carry every event, so every series is
downsampled by one rule (docs/reports.md): the trace's time span is cut into
`buckets` equal buckets and each series keeps, per bucket, its lowest and its
highest value at the times they happened (min/max decimation, as oscilloscopes
and tsdownsample's MinMax do). Peaks and troughs therefore survive exactly, a
leak's staircase keeps its shape, and a series never has more than
2 x `buckets` points whatever the trace's size. Rates are counts per bucket
divided by the bucket's length. A layer that was not recorded gives
`recorded: false` and no points, never a flat zero line.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from gputrace import schema
from gputrace.analyses.helpers.common import NS_PER_S
from gputrace.analyses.helpers.inputs import Inputs

BUCKETS = 1000
"""Default buckets per plot: at most 2000 points per series."""


MAX_SERIES = 12
"""Series drawn per plot, largest peak first; the rest are counted in `omitted`."""


def table_recorded(inp: Inputs, table: str) -> bool:
    """Could the trace hold rows of `table` (one of the layers that write it recorded)?"""
    return any(inp.has(layer) for layer in schema.table(table).layers)


def bucket_of(inp: Inputs, buckets: int) -> pl.Expr:
    """Which of `buckets` equal buckets of the trace's span each row's `ts_ns` falls in.

    Buckets are half-open, [start, end), as the fault-rate report's windows are: an
    event exactly on a boundary belongs to the later bucket; one at the trace's very
    end belongs to the last."""
    span = max(inp.end_ns - inp.start_ns, 1)
    return ((pl.col("ts_ns") - inp.start_ns).clip(0, span) * buckets // span
            ).clip(0, buckets - 1)


def decimate(series: pl.LazyFrame, key: list[str], value: str, inp: Inputs,
             buckets: int) -> pl.DataFrame:
    """Min/max decimation of step series (`key`, ts_ns, `value`): per key and bucket, the
    lowest and the highest value at the times they occurred, in time order."""
    per = (series.with_columns(_b=bucket_of(inp, buckets))
           .group_by([*key, "_b"])
           .agg(t_lo=pl.col("ts_ns").get(pl.col(value).arg_min()), lo=pl.col(value).min(),
                t_hi=pl.col("ts_ns").get(pl.col(value).arg_max()), hi=pl.col(value).max()))
    lo = per.select(*key, pl.col("t_lo").alias("ts_ns"), pl.col("lo").alias(value))
    hi = per.select(*key, pl.col("t_hi").alias("ts_ns"), pl.col("hi").alias(value))
    return pl.concat([lo, hi]).unique().sort([*key, "ts_ns", value]).collect()


def seconds_since_start(inp: Inputs, ts: pl.Series) -> list[float]:
    """Times `ts` (ns) as seconds since the trace started, to the microsecond."""
    return [round((int(t) - inp.start_ns) / NS_PER_S, 6) for t in ts]


def series_list(inp: Inputs, df: pl.DataFrame, key: list[str], value: str,
                 names: dict[tuple[Any, ...], str],
                 max_series: int | None = MAX_SERIES) -> dict[str, Any]:
    """Series of `df` as JSON, largest peak first, at most `max_series` of them."""
    groups = [(k, g) for k, g in df.group_by(key, maintain_order=True)]
    groups.sort(key=lambda kg: (-int(kg[1][value].max() or 0), str(kg[0])))  # type: ignore[arg-type]
    out = []
    keep = groups if max_series is None else groups[:max_series]
    for k, g in keep:
        row: dict[str, Any] = dict(zip(key, k, strict=True))
        row.update(name=names.get(tuple(k), " ".join(str(v) for v in k)),
                   t_s=seconds_since_start(inp, g["ts_ns"]), values=[int(v) for v in g[value]],
                   peak=int(g[value].max() or 0),  # type: ignore[arg-type]
                   end=int(g[value][-1]))
        out.append(row)
    return {"recorded": True, "series": out, "omitted": len(groups) - len(keep)}
