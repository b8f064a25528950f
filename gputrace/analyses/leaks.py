"""What memory was never given back, by whom, and is it growing?

An allocation is a leak of kind `alive_at_end` when it is unfreed at the end
of the trace and its process is still running, and `unfreed_at_exit` when
its process exited before any free, so only the driver's teardown reclaimed
it (compute-sanitizer's notion of a leak). Lifetimes come from
`lifetimes.lifetimes` (as-of pairing, RM subtree frees); failed allocations
never count. See docs/analyses/leaks.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from gputrace.analyses.common import Inputs, records, size_class, trace_warnings
from gputrace.analyses.growth import growth
from gputrace.analyses.lifetimes import lifetimes, recorded_layers
from gputrace.analyses.report import Report, not_recorded
from gputrace.analyses.rm_objects import VIRTUAL_LAYER

QUESTION = "What memory was never freed, by whom, and is any process's memory growing?"
FIELDS = ["layer", "pid", "comm", "kind", "id", "size_bytes", "alloc_ts_ns", "stack_id",
          "what", "age_s"]


@dataclass(frozen=True)
class LeakOptions:
    older_ns: int = 0
    min_size_bytes: int = 0
    top: int | None = None


def with_exits(frame: pl.LazyFrame, processes: pl.LazyFrame, ts: str) -> pl.LazyFrame:
    """Add `exit_ts_ns` and `pcomm` of the process instance (pid) running at `ts`."""
    procs = processes.select(
        "pid", pl.col("start_ts_ns").fill_null(0).alias("_start"), "exit_ts_ns",
        pl.col("comm").alias("pcomm")).sort("_start")
    return frame.sort(ts).join_asof(procs, left_on=ts, right_on="_start", by="pid",
                                    strategy="backward", check_sortedness=False).drop("_start")


def classify(lt: pl.LazyFrame, processes: pl.LazyFrame, end_ns: int) -> pl.LazyFrame:
    """Leaked allocations with `kind` and `age_s` (age at trace end or process exit)."""
    exit_ = pl.col("exit_ts_ns")
    free = pl.col("free_ts_ns")
    kind = (pl.when(exit_.is_not_null() & (free.is_null() | (free >= exit_)))
            .then(pl.lit("unfreed_at_exit"))
            .when(free.is_null()).then(pl.lit("alive_at_end")))
    return (with_exits(lt, processes, "alloc_ts_ns")
            .with_columns(kind=kind, comm=pl.coalesce("pcomm", "comm"))
            .filter(pl.col("kind").is_not_null())
            .with_columns(age_s=(pl.coalesce(exit_, pl.lit(end_ns)) - pl.col("alloc_ts_ns"))
                          / 1e9))


def stack_frames(stacks: pl.LazyFrame) -> pl.LazyFrame:
    """(pid, stack_id, frames): symbols innermost first, joined by ' < '."""
    return (stacks.sort("pid", "stack_id", "depth")
            .group_by("pid", "stack_id", maintain_order=True)
            .agg(pl.coalesce("symbol", _unresolved()).str.join(" < ").alias("frames")))


def _unresolved() -> pl.Expr:
    """An unsymbolized frame as perf prints it: module+0xoffset, else 0xip."""
    def hexa(c: str) -> pl.Expr:
        return pl.col(c).map_elements(lambda v: f"0x{v:x}", return_dtype=pl.String)

    module = pl.col("module").str.extract(r"([^/]+)$")
    return pl.coalesce(pl.format("{}+{}", module, hexa("offset")), hexa("ip"))


def leaks(inp: Inputs, opts: LeakOptions | None = None,
          lt: pl.LazyFrame | None = None) -> Report:
    """The leak report (pass `lt` to reuse lifetimes computed for the summary)."""
    o = opts or LeakOptions()
    layers = recorded_layers(inp)
    warnings = trace_warnings(inp)
    missing = sorted({"api" if k == "api" else "syscall" for k, v in layers.items() if not v})
    if not any(layers.values()):
        return not_recorded("leaks", QUESTION, missing, warnings,
                            {"allocations": [], "total_bytes": None})
    every = lifetimes(inp) if lt is None else lt
    lt = every.filter(pl.col("layer") != VIRTUAL_LAYER)
    leaked = classify(lt, inp.scan("processes"), inp.end_ns).filter(
        (pl.col("age_s") * 1e9 >= o.older_ns) & (pl.col("size_bytes") >= o.min_size_bytes))
    totals = leaked.group_by("layer").agg(pl.col("size_bytes").sum(), pl.len().alias("count"))
    by_proc = leaked.group_by("layer", "pid", "comm", "kind").agg(
        pl.len().alias("count"), pl.col("size_bytes").sum().alias("bytes"))
    by_stack = (leaked.filter(pl.col("stack_id").is_not_null())
                .group_by("layer", "pid", "stack_id")
                .agg(pl.len().alias("count"), pl.col("size_bytes").sum().alias("bytes"))
                .join(stack_frames(inp.scan("stacks")), on=["pid", "stack_id"], how="left"))
    by_size = leaked.with_columns(size_class=size_class()).group_by("layer", "size_class").agg(
        pl.len().alias("count"), pl.col("size_bytes").sum().alias("bytes"))
    virt = (classify(every.filter(pl.col("layer") == VIRTUAL_LAYER), inp.scan("processes"),
                     inp.end_ns)
            .select(pl.len().alias("count"), pl.col("size_bytes").sum().alias("bytes")))
    # Memory the program never freed but the driver tore down when the control fd
    # holding its client was released: not a leak, but worth knowing.
    closed = (lt.filter((pl.col("layer") == "rm") & (pl.col("freed_by") == "close"))
              .select(pl.len().alias("count"), pl.col("size_bytes").sum().alias("bytes")))
    allocs, tot, procs, stacks, sizes, virt_df, closed_df = pl.collect_all([
        leaked.sort("size_bytes", "alloc_ts_ns", "layer", "pid", "id",
                    descending=[True, False, False, False, False]).select(FIELDS),
        totals, by_proc.sort("bytes", "layer", "pid", "kind", descending=[True, False, False,
                                                                           False]),
        by_stack.sort("bytes", "layer", "pid", "stack_id", descending=[True, False, False,
                                                                        False]),
        by_size.sort("layer", "size_class"), virt, closed])
    grow = growth(lt)
    if o.top is not None:
        allocs, procs, stacks = allocs.head(o.top), procs.head(o.top), stacks.head(o.top)
    by_layer = {k: (int(tot.filter(pl.col("layer") == k)["size_bytes"].sum()) if v else None)
                for k, v in layers.items()}
    counts = {k: (int(tot.filter(pl.col("layer") == k)["count"].sum()) if v else None)
              for k, v in layers.items()}
    data = {
        "allocations": records(allocs),
        "total_bytes": max(b for b in by_layer.values() if b is not None),
        "bytes_by_layer": by_layer,
        "count_by_layer": counts,
        "layers": {k: ("recorded" if v else "not recorded") for k, v in layers.items()},
        "by_process": records(procs),
        "by_stack": records(stacks),
        "by_size_class": records(sizes),
        "growth": records(grow),
        "growing_pids": sorted({int(p) for p in grow.filter("flagged")["pid"]}),
        "rm_virtual_unreleased": {"count": int(virt_df["count"][0]),
                                  "bytes": int(virt_df["bytes"][0] or 0)}
        if layers["rm"] else None,
        "rm_freed_by_fd_close": {"count": int(closed_df["count"][0]),
                                 "bytes": int(closed_df["bytes"][0] or 0)}
        if layers["rm"] else None,
        "filters": {"older_s": o.older_ns / 1e9, "min_size_bytes": o.min_size_bytes,
                    "top": o.top},
    }
    for k, v in layers.items():
        if not v:
            warnings.append(f"leaks: layer {k} not recorded; its allocations are unknown")
    return Report("leaks", QUESTION, True, data, missing, warnings)
