"""Fleet reports on Dask distributed: one task per exported trace, merged by Dask's
tree reduction. docs/fleet.md says why Dask and what swapping it would take.

The client only reads the dataset index and sends each task a trace's index
entry; the task reads that trace's files from the store itself (on a cluster,
next to the data), runs the same `run_reports` as `gputrace analyze` and
returns a small partial. `Bag.reduction` combines partials in a tree of
`SPLIT_EVERY`-way merges on the workers; the client receives one partial.
"""

from __future__ import annotations

import functools
import logging
import resource
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import polars as pl

from gputrace.errors import GputraceError
from gputrace.fleet import where as wh
from gputrace.fleet.store import Store

SPLIT_EVERY = 8


def analyze_one(entry: dict[str, Any], *, store: Store, node: wh.Node | None,
                opts: dict[str, Any], keep_report: bool) -> dict[str, Any]:
    """The partial of one trace (an engine task): read, filter jobs, report. An entry
    with `job_filter` set keeps only the processes `node` selects."""
    from gputrace.analyses.report_spec import ReportOptions
    from gputrace.analyses.run import run_reports
    from gputrace.fleet.dataset import read_frames, read_record, trace_inputs
    from gputrace.fleet.reports import EMPTY, trace_partial
    from gputrace.schema import PROCESSES

    record = read_record(store, entry)
    frames = read_frames(store, record)
    procs = frames.get("processes", pl.DataFrame(schema=PROCESSES.polars_schema))
    pids = None
    if entry.get("job_filter") and node is not None:
        # a trace exported before a column existed: that field is unknown (null) there
        known = wh.TRACE_FIELDS + tuple(f for f in wh.JOB_FIELDS if f in procs.columns)
        hit = procs.with_columns(**{f: pl.lit(entry.get(f), pl.String) for f in wh.TRACE_FIELDS})
        pids = set(hit.filter(wh.to_expr(node, known))["pid"].to_list())
        if not pids:
            return dict(EMPTY)
    doc = run_reports(trace_inputs(record, frames, pids), None, ReportOptions(**opts))
    return trace_partial(entry, doc, procs, keep_report)


def peak_rss_bytes() -> int:
    """This process's peak resident memory (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@contextmanager
def client(scheduler: str | None, workers: int) -> Iterator[Any]:
    """A Dask client: of the cluster at `scheduler`, else of a local cluster of
    `workers` single-threaded worker processes (closed on exit)."""
    from distributed import Client, LocalCluster

    if scheduler:
        try:
            c = Client(scheduler, timeout="10s")  # type: ignore[no-untyped-call]
        except (OSError, TimeoutError, ValueError) as e:
            raise GputraceError(f"cannot reach the Dask scheduler at {scheduler} "
                                f"({str(e).splitlines()[0] if str(e) else type(e).__name__})"
                                ) from None
        with c:
            yield c
        return
    # No dashboard; the scheduler's HTTP server still starts, so it takes any free
    # port on loopback: on its default 8787, a busy port prints a warning on stderr.
    cluster = LocalCluster(  # type: ignore[no-untyped-call]
        n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
        scheduler_kwargs={"dashboard": False, "dashboard_address": "127.0.0.1:0"},
        silence_logs=logging.CRITICAL)
    with cluster, Client(cluster) as c:  # type: ignore[no-untyped-call]
        yield c


def run(store: Store, entries: list[dict[str, Any]], *, node: wh.Node | None,
        opts: dict[str, Any], top: int | None, keep_report: bool, scheduler: str | None,
        workers: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The merged partial of `entries` and facts about the engine run."""
    import dask.bag as db

    from gputrace.fleet.reports import EMPTY, merge

    with client(scheduler, workers) as c:
        info: dict[str, Any] = {"engine": "dask.distributed", "scheduler": scheduler or "local",
                                "tasks": len(entries)}
        if not entries:
            part = {**EMPTY}
        else:
            task = functools.partial(analyze_one, store=store, node=node, opts=opts,
                                     keep_report=keep_report)
            merged = functools.partial(merge, top=top)
            bag = db.from_sequence(  # type: ignore[no-untyped-call]
                entries, npartitions=len(entries))
            part = bag.map(task).reduction(merged, merged, split_every=SPLIT_EVERY).compute()
        rss = c.run(peak_rss_bytes)
        info["workers"] = len(rss)
        info["worker_peak_rss_bytes"] = sorted(rss.values())
    return part, info
