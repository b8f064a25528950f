"""How many faults per second, on average and in the busiest window?

Windows of `window_s` cut the trace span (`windows` says how the remainder is
treated); faults per (pid, GPU, source, access type) and GPU faults per window.
Part of the fault-rate report.
"""

from __future__ import annotations

import polars as pl

from gputrace.analyses.helpers.common import NS_PER_S


def windows(start_ns: int, end_ns: int, window_s: float) -> tuple[int, int, int]:
    """(window length ns, number of windows, length of the last window ns).

    Windows of `window_s` start at the trace start and the last one ends at the trace
    end. A remainder of at least half a window is a window of its own (shorter, its
    rate divided by its own length); a shorter remainder joins the window before it,
    so no window but a whole trace shorter than half a window is under half a window
    long, and a few faults at the very end cannot make a peak out of a sliver. Every
    event lies in the window that contains it, and every window lies inside the span,
    so the mean over the span (total / span) is a length-weighted average of the
    window rates and never exceeds the peak.
    """
    w = max(int(window_s * NS_PER_S), 1)
    span = max(end_ns - start_ns, 1)
    full, rem = divmod(span, w)
    if full == 0:
        return w, 1, span
    if rem == 0:
        return w, full, w
    if 2 * rem >= w:
        return w, full + 1, rem
    return w, full, w + rem


def window_of(start_ns: int, w: int, k: int) -> pl.Expr:
    """The window holding each row (a short remainder belongs to the last window)."""
    return ((pl.col("ts_ns") - start_ns) // w).clip(0, k - 1)


def window_length(w: int, k: int, last: int) -> pl.Expr:
    """Length in seconds of window `win`."""
    return pl.when(pl.col("win") == k - 1).then(last).otherwise(w) / NS_PER_S


def rates(faults: pl.LazyFrame, start_ns: int, end_ns: int, window_s: float) -> pl.LazyFrame:
    """Faults per (pid, GPU, source, access type): total, mean/s over the span, and the
    busiest window (see `windows` for the window rule)."""
    w, k, last = windows(start_ns, end_ns, window_s)
    span_s = max(end_ns - start_ns, 1) / NS_PER_S
    key = ["pid", "gpu_index", "source", "access_type"]
    per = (faults.with_columns(win=window_of(start_ns, w, k))
           .group_by(*key, "win").agg(pl.len().alias("n"))
           .with_columns(len_s=window_length(w, k, last))
           .with_columns(rate=pl.col("n") / pl.col("len_s")))
    def busiest(c: str) -> pl.Expr:
        # earliest of the busiest windows, so ties give the same answer every run
        return pl.col(c).sort_by(["rate", "win"], descending=[True, False]).first()

    return (per.group_by(key).agg(
        pl.col("n").sum().alias("faults"),
        pl.col("rate").max().alias("peak_per_s"),
        (busiest("win") * w / NS_PER_S).alias("peak_window_start_s"),
        busiest("len_s").alias("peak_window_len_s"))
        .with_columns(mean_per_s=pl.col("faults") / span_s)
        .sort("faults", *key, descending=[True, False, False, False, False], nulls_last=True))


def gpu_windows(faults: pl.LazyFrame, start_ns: int, end_ns: int,
                window_s: float) -> pl.LazyFrame:
    """GPU faults per window, GPU and process, busiest first (same windows as `rates`)."""
    w, k, last = windows(start_ns, end_ns, window_s)
    return (faults.filter(pl.col("gpu_index").is_not_null())
            .with_columns(win=window_of(start_ns, w, k))
            .group_by("gpu_index", "pid", "win").agg(pl.len().alias("faults"))
            .with_columns(window_start_s=pl.col("win") * w / NS_PER_S,
                          window_len_s=window_length(w, k, last))
            .with_columns(per_s=pl.col("faults") / pl.col("window_len_s"))
            .drop("win")
            .sort("per_s", "gpu_index", "pid", "window_start_s",
                  descending=[True, False, False, False], nulls_last=True))
