"""Does memory held by tensors grow over the allocator's history, and which Python
lines hold on to what they allocated?

Replays the caching allocator's trace entries (allocator_events) in order: `alloc`
adds a block's bytes to the active bytes and `free_completed` removes them (a
`free_requested` block stays active until its streams are done with it, as PyTorch
counts it); `segment_alloc`/`segment_map` add to the reserved bytes and
`segment_free`/`segment_unmap` remove them. A snapshot keeps only its last entries,
so the series is anchored at its end: the bytes active (reserved) in the snapshot's
segments, minus the changes replayed, is what was active (reserved) when the kept
history begins.

By stack: each `alloc` is paired with the next `free_completed` of the same device
and address; what is not freed by the end of the history is retained. A stack that
allocates on every iteration and never frees retains `retained_bytes_per_alloc` per
call: the planted leak of the real H200 snapshot, 16 MiB per iteration.
"""

from __future__ import annotations

from typing import Any, cast

import polars as pl

from gputrace.analyses.allocator.frames import with_labels
from gputrace.analyses.helpers.common import NS_PER_S
from gputrace.analyses.helpers.inputs import Inputs, trace_warnings
from gputrace.analyses.registry import spec, unrecorded
from gputrace.analyses.report import Report

SPEC = spec("allocator-growth")
QUESTION = SPEC.question


MAX_POINTS = 400
"""Points of the active-bytes series; a longer history keeps every k-th entry plus the
entry at its peak and the last one."""

_ACTIVE = {"alloc": 1, "free_completed": -1}
_RESERVED = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}


def _sign(table: dict[str, int]) -> pl.Expr:
    return pl.col("action").replace_strict(table, default=0, return_dtype=pl.Int64)


def replay(inp: Inputs) -> pl.LazyFrame:
    """Every trace entry in order (`i`), with active and reserved bytes after it."""
    ev = (inp.scan("allocator_events").sort("ts_ns", "device", "seq")
          .with_row_index("i")
          .with_columns(size=pl.col("size_bytes").cast(pl.Int64).fill_null(0))
          .with_columns(d_active=_sign(_ACTIVE) * pl.col("size"),
                        d_reserved=_sign(_RESERVED) * pl.col("size")))
    end = inp.scan("allocator_segments").select(
        pl.col("active_size_bytes").cast(pl.Int64).sum().alias("end_active"),
        pl.col("total_size_bytes").cast(pl.Int64).sum().alias("end_reserved"))
    return (ev.join(end, how="cross")
            .with_columns(
                active_bytes=pl.col("end_active") - pl.col("d_active").sum()
                + pl.col("d_active").cum_sum(),
                reserved_bytes=pl.col("end_reserved") - pl.col("d_reserved").sum()
                + pl.col("d_reserved").cum_sum()))


def retained_by_stack(inp: Inputs, events: pl.LazyFrame) -> pl.LazyFrame:
    """Per allocating stack: allocs, and how many (bytes) were not freed by the end."""
    allocs = events.filter(pl.col("action") == "alloc").select(
        "i", "device", "address", "size", "stack_id")
    frees = (events.filter(pl.col("action") == "free_completed")
             .select("device", "address", pl.col("i").alias("free_i")))
    paired = allocs.sort("i").join_asof(frees.sort("free_i"), left_on="i", right_on="free_i",
                                        by=["device", "address"], strategy="forward",
                                        check_sortedness=False)
    per = paired.group_by("stack_id").agg(
        pl.len().alias("allocs"), pl.col("size").sum().alias("alloc_bytes"),
        pl.col("free_i").is_null().sum().alias("retained_count"),
        pl.col("size").filter(pl.col("free_i").is_null()).sum().alias("retained_bytes"))
    per = per.with_columns(
        (pl.col("retained_bytes") / pl.col("allocs")).alias("retained_bytes_per_alloc"))
    return with_labels(inp, per).sort(["retained_bytes", "allocs", "top_frame"],
                                      descending=[True, True, False])


def _series(df: pl.DataFrame) -> pl.DataFrame:
    """At most about MAX_POINTS rows of the replay, keeping the peak and the last one."""
    n = df.height
    if n <= MAX_POINTS:
        return df
    step = -(-n // MAX_POINTS)
    peak = int(df["active_bytes"].arg_max() or 0)
    keep = pl.Series(sorted({*range(0, n, step), peak, n - 1}))
    return df[keep]


def growth(inp: Inputs, top: int | None = None) -> Report:
    """The allocator growth report: active bytes over the history, retained by stack."""
    warnings = trace_warnings(inp)
    if (absent := unrecorded(SPEC, inp, warnings)) is not None:
        return absent
    events = replay(inp)
    stacks, rep = pl.collect_all([retained_by_stack(inp, events), events.select(
        "i", "ts_ns", "seq", "device", "action", "size", "active_bytes", "reserved_bytes")])
    data: dict[str, Any] = {"entries": rep.height, "by_stack": [], "series": [],
                            "start_active_bytes": None, "end_active_bytes": None,
                            "peak_active_bytes": None, "growth_bytes": None,
                            "growth_bytes_per_s": None, "span_s": None,
                            "start_reserved_bytes": None, "end_reserved_bytes": None}
    if rep.height == 0:
        warnings.append("allocator-growth: the snapshot holds no trace entries (history not "
                        "recorded: torch.cuda.memory._record_memory_history() before the run)")
        return Report("allocator-growth", QUESTION, True, data, [], warnings)
    first, last = rep.row(0, named=True), rep.row(-1, named=True)
    start_active = first["active_bytes"] - _delta(first, _ACTIVE)
    start_reserved = first["reserved_bytes"] - _delta(first, _RESERVED)
    if start_active < 0 or start_reserved < 0:
        warnings.append("allocator-growth: the trace entries do not add up to the "
                        "snapshot's segments (entries lost or a damaged snapshot); the "
                        "series is anchored at the snapshot and may be off")
    span_s = (last["ts_ns"] - first["ts_ns"]) / NS_PER_S
    grown = last["active_bytes"] - start_active
    rows: list[dict[str, Any]] = stacks.to_dicts()
    pts = _series(rep)
    data.update(
        start_active_bytes=start_active, end_active_bytes=last["active_bytes"],
        peak_active_bytes=max(int(cast(int, rep["active_bytes"].max())), start_active),
        growth_bytes=grown, span_s=span_s,
        growth_bytes_per_s=grown / span_s if span_s > 0 else None,
        start_reserved_bytes=start_reserved, end_reserved_bytes=last["reserved_bytes"],
        by_stack=rows[:top] if top is not None else rows,
        series=[{"t_s": (r["ts_ns"] - inp.start_ns) / NS_PER_S, "entry": r["i"],
                 "action": r["action"], "active_bytes": r["active_bytes"],
                 "reserved_bytes": r["reserved_bytes"]} for r in pts.iter_rows(named=True)])
    return Report("allocator-growth", QUESTION, True, data, [], warnings)


def _delta(row: dict[str, Any], table: dict[str, int]) -> int:
    """The change the entry `row` made to the bytes counted by `table`."""
    return table.get(row["action"], 0) * int(row["size"])
