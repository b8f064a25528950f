"""Is a process's memory climbing over time, and how fast?

Live bytes per (layer, process) are replayed from allocation lifetimes. The
span from the process's first to last event is cut into 32 equal bins and
each bin keeps its lowest live bytes, counting the value carried into it
(the trough between iterations, so short-lived temporaries do not hide or
fake a trend). A Theil-Sen line (the
median of all pairwise slopes, robust to outliers) is fitted to the troughs;
its quality is R² of that line (the share of the troughs' variance it
explains, 0 when none: a robust line can fit worse than their mean, where
1 - SSres/SStot would go negative) and the median absolute deviation (MAD) of
its residuals. A series is flagged as growing only with evidence: it spans at
least `MIN_DURATION_S` seconds, its trough rose from one bin to the next at
least `MIN_RISES` times (iterations that each left memory behind), the slope
is positive, R² >= 0.5 and the fitted rise over the span is at least 1 MiB and
10 % of the process's peak live bytes. Reservations are not memory and never
reach this series (`lifetimes.memory`).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from gputrace.analyses.helpers.common import NS_PER_MIN, MiB

BINS = 32
MIN_R2 = 0.5
MIN_RISE_BYTES = MiB
MIN_RISE_SHARE = 0.10
MIN_DURATION_S = 5.0
"""Shortest span (first to last event of the series) that can be called growing."""
MIN_RISES = 4
"""Fewest bin-to-bin rises of the trough (leaky iterations) that can be called growing."""
KEY = ["layer", "pid"]


def live_series(lifetimes: pl.LazyFrame) -> pl.LazyFrame:
    """Step series of live bytes: (layer, pid, ts_ns, live_bytes) after each event, in
    time order; at equal times frees come first. One single-column sort by time (a
    window sum keeps each series' own order), no sort by key."""
    up = lifetimes.select(*KEY, pl.col("alloc_ts_ns").alias("ts_ns"),
                          pl.col("size_bytes").alias("delta"))
    down = lifetimes.filter(pl.col("free_ts_ns").is_not_null()).select(
        *KEY, pl.col("free_ts_ns").alias("ts_ns"), (-pl.col("size_bytes")).alias("delta"))
    return (pl.concat([up, down])
            .sort(pl.col("ts_ns") * 2 + (pl.col("delta") > 0).cast(pl.Int64))
            .with_columns(live_bytes=pl.col("delta").cum_sum().over(KEY)).drop("delta"))


def theil_sen(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float, float]:
    """(slope, intercept, r2, mad of residuals) of the Theil-Sen line through x, y."""
    i, j = np.triu_indices(len(x), k=1)
    dx = x[j] - x[i]
    ok = dx != 0
    if not ok.any():
        return 0.0, float(np.median(y)), 0.0, 0.0
    slope = float(np.median((y[j] - y[i])[ok] / dx[ok]))
    intercept = float(np.median(y - slope * x))
    resid = y - (slope * x + intercept)
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = max(0.0, 1.0 - float(np.sum(resid**2)) / ss_tot) if ss_tot > 0 else 0.0
    return slope, intercept, r2, float(np.median(np.abs(resid - np.median(resid))))


def theil_sen_rows(x: np.ndarray, y: np.ndarray) -> list[tuple[float, float, float, float]]:
    """`theil_sen` of each row of x, y (m series of k points each), computed together
    (the same numbers: each median and sum runs over one row as it would alone)."""
    i, j = np.triu_indices(x.shape[1], k=1)
    dx = x[:, j] - x[:, i]
    if not (dx != 0).all():  # never with distinct bins over a positive span
        return [theil_sen(x[r], y[r]) for r in range(len(x))]
    slope = np.median((y[:, j] - y[:, i]) / dx, axis=1)
    intercept = np.median(y - slope[:, None] * x, axis=1)
    resid = y - (slope[:, None] * x + intercept[:, None])
    ss_tot = np.sum((y - y.mean(axis=1)[:, None]) ** 2, axis=1)
    ss_res = np.sum(resid**2, axis=1)
    mad = np.median(np.abs(resid - np.median(resid, axis=1)[:, None]), axis=1)
    return [(float(slope[r]), float(intercept[r]),
             max(0.0, 1.0 - float(ss_res[r]) / float(ss_tot[r])) if ss_tot[r] > 0 else 0.0,
             float(mad[r])) for r in range(len(x))]


def growth(lifetimes: pl.LazyFrame) -> pl.DataFrame:
    """One row per (layer, pid): slope in bytes/minute, fit quality, flag."""
    series = live_series(lifetimes)
    spans = series.group_by(KEY).agg(
        t0=pl.col("ts_ns").min(), t1=pl.col("ts_ns").max(), events=pl.len(),
        peak_bytes=pl.col("live_bytes").max(), end_bytes=pl.col("live_bytes").last())
    binned = (series.with_columns(t0=pl.col("ts_ns").min().over(KEY),
                                  t1=pl.col("ts_ns").max().over(KEY))
              .with_columns(bin=((pl.col("ts_ns") - pl.col("t0")) * BINS
                                 // (pl.col("t1") - pl.col("t0") + 1)))
              .group_by([*KEY, "bin"]).agg(pl.col("live_bytes").min().alias("low"),
                                           pl.col("live_bytes").last().alias("last"))
              .sort([*KEY, "bin"])
              # the step value carried into a bin counts towards its minimum too;
              # before a series' first event nothing of it was live (0 bytes)
              .with_columns(trough=pl.min_horizontal(
                  "low", pl.col("last").shift(1).over(KEY).fill_null(0))))
    spans_df, bins_df = pl.collect_all([spans, binned])
    # one group-by and one join: each series' bins as lists beside its span (looking a
    # span up per series would scan them all once per series: quadratic in processes)
    per = (bins_df.group_by(KEY, maintain_order=True).agg("bin", "trough")
           .join(spans_df, on=KEY, how="left")
           .select(*KEY, "events", "t0", "t1", "peak_bytes", "end_bytes", "bin", "trough"))
    cols = per.to_dict(as_series=False)
    rows = [{"layer": layer, "pid": pid, "events": events,
             "duration_s": (t1 - t0) / NS_PER_MIN * 60, "peak_bytes": peak,
             "end_bytes": end, "slope_bytes_per_min": None, "r2": None,
             "mad_bytes": None, "rising_troughs": 0, "flagged": False}
            for layer, pid, events, t0, t1, peak, end in zip(
                cols["layer"], cols["pid"], cols["events"], cols["t0"], cols["t1"],
                cols["peak_bytes"], cols["end_bytes"], strict=True)]
    # series with the same number of bins are fitted together, one array each
    by_k: dict[int, list[int]] = {}
    for i, (bins, t0, t1) in enumerate(zip(cols["bin"], cols["t0"], cols["t1"], strict=True)):
        if len(bins) >= 3 and t1 > t0:
            by_k.setdefault(len(bins), []).append(i)
    for idx in by_k.values():
        dur_min = np.array([(cols["t1"][i] - cols["t0"][i]) / NS_PER_MIN for i in idx])
        x = np.array([cols["bin"][i] for i in idx], dtype=np.float64) * dur_min[:, None] / BINS
        y = np.array([cols["trough"][i] for i in idx], dtype=np.float64)
        fits = theil_sen_rows(x, y)
        rises = (np.diff(y, axis=1) > 0).sum(axis=1)
        for n, i in enumerate(idx):
            slope, _, r2, mad = fits[n]
            d, peak = float(dur_min[n]), rows[i]["peak_bytes"]
            rise = slope * d
            rows[i].update(slope_bytes_per_min=slope, r2=r2, mad_bytes=mad,
                           rising_troughs=int(rises[n]), flagged=bool(
                d * 60 >= MIN_DURATION_S and rises[n] >= MIN_RISES
                and slope > 0 and r2 >= MIN_R2 and rise >= MIN_RISE_BYTES
                and rise >= MIN_RISE_SHARE * float(peak or 0)))
    schema = {"layer": pl.String, "pid": pl.Int32, "events": pl.UInt32,
              "duration_s": pl.Float64, "peak_bytes": pl.Int64, "end_bytes": pl.Int64,
              "slope_bytes_per_min": pl.Float64, "r2": pl.Float64, "mad_bytes": pl.Float64,
              "rising_troughs": pl.Int64, "flagged": pl.Boolean}
    return pl.DataFrame(rows, schema=schema).sort(KEY)
