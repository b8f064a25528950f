"""Which container and pod did each process's figures come from? (`analyze --by pod`,
`--by container`).

Any report whose rows carry a `pid` uses the same two steps: `with_identity` adds the
processes table's identity columns (schema.IDENTITY_COLUMNS, derived at recording by
gputrace/identity.py) to its rows, `by_identity` adds its figures up per pod or per
container. Rows of processes in no pod (or no container) form one group whose keys are
null: the host's.

A group's memory figure is the sum over its processes of each process's ONE figure
(the leak report feeds `leaks/held_end.py`: what each held at its exit, from the joined
allocation model), never a sum over layers that see the same bytes: a per-layer column
beside it is a breakdown (`<layer>_layer_bytes`). Counts of events (faults, incidents)
add up over any rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from gputrace import schema

GROUP_KEYS: dict[str, tuple[str, ...]] = {
    "pod": ("pod_namespace", "pod_name", "pod_uid", "qos_class"),
    "container": ("pod_namespace", "pod_name", "container_name", "container_id",
                  "container_runtime", "pod_uid"),
}
"""The columns that name a group of each `--by` (the uid and id make it; the rest say it)."""

IDENTITY = [c.name for c in schema.IDENTITY_COLUMNS]
_FIRST = -(1 << 62)  # a process that predates the trace started before any event


def process_identity(processes: pl.LazyFrame) -> pl.LazyFrame:
    """One row per pid: its identity columns (of the pid's latest process instance that
    has any; a reused pid's instances may differ: `with_identity(..., at=)` tells them
    apart)."""
    known = pl.any_horizontal([pl.col(c).is_not_null() for c in IDENTITY])
    return (processes.with_columns(_known=known, _start=pl.col("start_ts_ns").fill_null(_FIRST))
            .sort("_known", "_start")
            .group_by("pid").agg(pl.col(IDENTITY).last()))


def with_identity(frame: pl.LazyFrame, processes: pl.LazyFrame,
                  at: str | None = None) -> pl.LazyFrame:
    """`frame` (rows with a `pid`) with the identity columns of its process: the pid's
    (`process_identity`), or with `at` (a time column of `frame`) the instance of the pid
    that had started by then. Columns of `frame` with those names are replaced."""
    base = frame.drop([c for c in IDENTITY if c in frame.collect_schema().names()])
    if at is None:
        return base.join(process_identity(processes), on="pid", how="left")
    procs = (processes.select("pid", pl.col("start_ts_ns").fill_null(_FIRST).alias("_start"),
                              *IDENTITY)
             .sort("_start"))
    return (base.with_row_index("_row").sort(at)
            # both sides are sorted on the time (polars cannot check it within `by` groups)
            .join_asof(procs, left_on=at, right_on="_start", by="pid", strategy="backward",
                       check_sortedness=False)
            .sort("_row").drop("_row", "_start"))


def by_identity(frame: pl.LazyFrame, processes: pl.LazyFrame, by: str,
                sums: Sequence[str], keys: Sequence[str] = ()) -> pl.LazyFrame:
    """`sums` added up per pod or container (`by`, a GROUP_KEYS key), and per `keys` of
    `frame`, with `processes`: how many pids. Largest first by the first of `sums`."""
    group = [*keys, *GROUP_KEYS[by]]
    first = sums[0]
    return (with_identity(frame, processes)
            .group_by(group)
            .agg(pl.col("pid").n_unique().alias("processes"), *[pl.col(c).sum() for c in sums])
            .sort([first, *group], descending=[True, *[False] * len(group)], nulls_last=True))
