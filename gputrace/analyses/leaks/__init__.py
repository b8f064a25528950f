"""What memory was never given back, by whom, and is it growing?

An allocation is a leak of kind `alive_at_end` when it is unfreed at the end
of the trace and its process is still running, and `unfreed_at_exit` when
its process exited before any free, so only the driver's teardown reclaimed
it (compute-sanitizer's notion of a leak). Lifetimes come from
`lifetimes.lifetimes` (as-of pairing, RM subtree frees); failed allocations
never count. The headline (`total_bytes`) and the joined view, each piece of
memory told once, come from the `allocations` model (leaks_joined); the
per-layer lists (`allocations`, `by_process`, ...) stay for `--by-layer`.
See docs/analyses/leaks.md and docs/analyses/allocations.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import polars as pl

from gputrace.analyses import fail_on
from gputrace.analyses.allocations.rows import leak_kind, with_exits
from gputrace.analyses.helpers.common import records, size_class
from gputrace.analyses.helpers.identity import by_identity
from gputrace.analyses.helpers.inputs import Inputs, trace_warnings
from gputrace.analyses.helpers.lifetimes import VIRTUAL_LAYERS, recorded_layers
from gputrace.analyses.helpers.partition import Slice, per_slice
from gputrace.analyses.helpers.rm_objects import VIRTUAL_LAYER
from gputrace.analyses.helpers.stacks import stack_sites
from gputrace.analyses.leaks.allocator_growth import allocator_growth
from gputrace.analyses.leaks.growth import growth
from gputrace.analyses.leaks.held_end import BREAKDOWN, FIGURES, held_end, held_end_part
from gputrace.analyses.leaks.leaks_joined import joined_part, joined_report
from gputrace.analyses.registry import unrecorded
from gputrace.analyses.report import Report
from gputrace.analyses.report_spec import DiffTable, FleetUse, Gate, ReportSpec

if TYPE_CHECKING:
    from gputrace.analyses.registry import Context

__all__ = ["LeakOptions", "classify", "leak_part", "leaks", "with_exits"]

_HELD_COLUMNS = ("processes", "held_bytes", "program_bytes", "allocator_pool_bytes",
                 "cuda_context_bytes", "driver_only_bytes", "pieces", "api_layer_bytes",
                 "rm_layer_bytes", "uvm_layer_bytes")
"""`leaks --by pod|container`: each group's held figure (one per process, added over its
processes: leaks/held_end.py), its classes, then the per-layer breakdown."""


def _options(ctx: Context) -> LeakOptions:
    o = ctx.opts
    opts: LeakOptions = ctx.memo("leak_options",
                                 lambda: LeakOptions(o.older_ns, o.min_size, o.top, o.by))
    return opts


def _part(ctx: Context, sl: Slice) -> Any:
    return leak_part(sl, _options(ctx))


def _run(ctx: Context) -> Report:
    return leaks(ctx.inp, _options(ctx), ctx.parts("leaks"))


_SECTIONS = "gputrace.render.html_sections"

SPEC = ReportSpec(
    "leaks", "leaks", "Leaks",
    "What memory was never freed, by whom, and is any process's memory growing?",
    ("api", "syscall"), _run, _part,
    (Gate("leaks", fail_on.leaks_hit), Gate("growth", fail_on.growth_hit)),
    unrecorded_data={"allocations": [], "total_bytes": None},
    terminal="gputrace.render.leak_sections:leaks_section",
    terminal_by_layer="gputrace.render.leak_sections:leaks_by_layer_section",
    html=(f"{_SECTIONS}:live_bytes", f"{_SECTIONS}:active_memory",
          f"{_SECTIONS}:leak_sites"),
    diff=(DiffTable("leak_sites", "Leak sites (leaked bytes by call stack)", ("@stacks",),
                    ("layer", "comm", "stack"), ("bytes", "count"), is_bytes=True),),
    columns={"by_pod": ("pod_namespace", "pod_name", *_HELD_COLUMNS, "pod_uid",
                        "qos_class"),
             "by_container": ("pod_namespace", "pod_name", "container_name",
                              *_HELD_COLUMNS, "container_id", "container_runtime",
                              "pod_uid")},
    fleet=FleetUse(answers=("leaks", "holders")), place=10)
QUESTION = SPEC.question
MAX_ROWS = 10_000
"""Rows a per-allocation or per-process list of the report holds at most (without
--top): a trace of 10^6 processes has 10^6 growth fits and leaked pieces, whose
JSON alone is gigabytes. Lists are sorted largest (flagged) first; every headline and
total still counts every row, and `left_out` says per list how many rows were not
listed (docs/security.md)."""
FIELDS = ["layer", "pid", "comm", "kind", "id", "size_bytes", "alloc_ts_ns", "stack_id",
          "what", "age_s"]


@dataclass(frozen=True)
class LeakOptions:
    older_ns: int = 0
    min_size_bytes: int = 0
    top: int | None = None
    by: str | None = None  # also per "pod" or "container" (helpers/identity.py)


def classify(lt: pl.LazyFrame, processes: pl.LazyFrame, end_ns: int) -> pl.LazyFrame:
    """Leaked allocations with `kind` and `age_s` (age at trace end or process exit)."""
    exit_ = pl.col("exit_ts_ns")
    kind = leak_kind()
    return (with_exits(lt, processes, "alloc_ts_ns")
            .with_columns(kind=kind, comm=pl.coalesce("pcomm", "comm"))
            .filter(pl.col("kind").is_not_null())
            .with_columns(age_s=(pl.coalesce(exit_, pl.lit(end_ns)) - pl.col("alloc_ts_ns"))
                          / 1e9))


def leak_part(sl: Slice, opts: LeakOptions | None = None) -> dict[str, pl.DataFrame]:
    """The leak findings of one pid slice (its lifetimes, virtual included, and its
    allocations model): per-process frames to concatenate and sums to add up."""
    o = opts or LeakOptions()
    inp, every = sl.inp, sl.lifetimes
    lt = every.filter(~pl.col("layer").is_in(list(VIRTUAL_LAYERS)))
    # the model's rows carry each memory row's leak kind and age: no second classify
    leaked = sl.model(held_only=True)[0].lazy().filter(pl.col("kind").is_not_null()).filter(
        (pl.col("age_s") * 1e9 >= o.older_ns) & (pl.col("size_bytes") >= o.min_size_bytes))
    count_bytes = [pl.len().cast(pl.Int64).alias("count"), pl.col("size_bytes").sum()]
    by_stack = (leaked.filter(pl.col("stack_id").is_not_null())
                .group_by("layer", "pid", "stack_id")
                .agg(pl.len().alias("count"), pl.col("size_bytes").sum().alias("bytes"))
                .join(stack_sites(inp), on=["pid", "stack_id"], how="left"))
    virt = classify(every.filter(pl.col("layer") == VIRTUAL_LAYER), inp.scan("processes"),
                    inp.end_ns)
    # Memory the program never freed but the driver tore down when the control fd
    # holding its client was released: not a leak, but worth knowing.
    closed = lt.filter((pl.col("layer") == "rm") & (pl.col("freed_by") == "close"))
    names = ["allocations", "totals", "by_process", "by_stack", "by_size", "virt", "closed"]
    frames = pl.collect_all([
        leaked.select(FIELDS), leaked.group_by("layer").agg(count_bytes),
        leaked.group_by("layer", "pid", "comm", "kind").agg(
            pl.len().alias("count"), pl.col("size_bytes").sum().alias("bytes")),
        by_stack, leaked.group_by("layer", size_class=size_class()).agg(count_bytes),
        virt.select(count_bytes), closed.select(count_bytes)])
    return {**dict(zip(names, frames, strict=True)), "growth": growth(lt),
            **allocator_growth(lt, inp.scan("stacks")),
            **joined_part(sl, o.older_ns, o.min_size_bytes), "held_end": held_end_part(sl)}


def _sums(parts: list[dict[str, pl.DataFrame]], name: str, *by: str) -> pl.DataFrame:
    """Per-slice counts and byte sums of `name` added up (grouped by `by`)."""
    df = pl.concat([p[name] for p in parts])
    agg = [pl.col("count").sum(), pl.col("size_bytes").sum()]
    return df.group_by(by).agg(agg) if by else df.select(agg)


def leaks(inp: Inputs, opts: LeakOptions | None = None,
          parts: list[dict[str, pl.DataFrame]] | None = None) -> Report:
    """The leak report, from the `leak_part` of each pid slice (computed when not given)."""
    o = opts or LeakOptions()
    warnings = trace_warnings(inp)
    if (absent := unrecorded(SPEC, inp, warnings)) is not None:
        return absent
    layers = recorded_layers(inp)
    missing = [x for x in SPEC.layers if not inp.has(x)]
    if parts is None:
        parts = per_slice(inp, {"leaks": lambda sl: leak_part(sl, o)})["leaks"]
    allocs = pl.concat([p["allocations"] for p in parts]).sort(
        "size_bytes", "alloc_ts_ns", "layer", "pid", "id",
        descending=[True, False, False, False, False])
    tot = _sums(parts, "totals", "layer")
    procs = pl.concat([p["by_process"] for p in parts]).sort(
        "bytes", "layer", "pid", "kind", descending=[True, False, False, False])
    stacks = pl.concat([p["by_stack"] for p in parts]).sort(
        "bytes", "layer", "pid", "stack_id", descending=[True, False, False, False])
    sizes = (_sums(parts, "by_size", "layer", "size_class").sort("layer", "size_class")
             .select("layer", "size_class", "count", pl.col("size_bytes").alias("bytes")))
    virt_df, closed_df = _sums(parts, "virt"), _sums(parts, "closed")
    grow = pl.concat([p["growth"] for p in parts])
    a_grow = pl.concat([p["allocator_growth"] for p in parts])
    a_segs = pl.concat([p["allocator_segments"] for p in parts]).sort(
        "bytes", "allocator", "pid", "stack_id", descending=[True, False, False, False])
    # each process's one figure (the joined model), the per-layer rows its breakdown
    held = held_end([p["held_end"] for p in parts], procs)
    groups = None if o.by is None else by_identity(
        held.lazy(), inp.scan("processes"), o.by, [*FIGURES, *BREAKDOWN]).collect()
    # growth fits: the flagged (growing) first, then the largest
    first = ["flagged", "peak_bytes"]
    grow = grow.sort([*first, "layer", "pid"], descending=[True, True, False, False])
    a_grow = a_grow.sort([*first, "allocator", "pid"], descending=[True, True, False, False])
    growing = sorted({int(p) for p in grow.filter("flagged")["pid"]})
    rows = o.top if o.top is not None else MAX_ROWS
    lists = {"allocations": allocs, "by_process": procs, "by_stack": stacks, "growth": grow,
             "growth_by_allocator": a_grow, "allocator_sites": a_segs, "held_at_end": held}
    left_out = {k: v.height - rows for k, v in lists.items() if v.height > rows}
    held_total = int(held["held_bytes"].sum() or 0)
    allocs, procs, stacks, grow, a_grow, a_segs, held = (v.head(rows) for v in lists.values())
    grow, a_grow = grow.sort("layer", "pid"), a_grow.sort("allocator", "pid")  # as listed
    joined = joined_report(parts, o.top, layers["api"], MAX_ROWS)
    left_out.update(joined.pop("joined_left_out"))
    by_layer = {k: (int(tot.filter(pl.col("layer") == k)["size_bytes"].sum()) if v else None)
                for k, v in layers.items()}
    counts = {k: (int(tot.filter(pl.col("layer") == k)["count"].sum()) if v else None)
              for k, v in layers.items()}
    data = {
        "allocations": records(allocs),
        **joined,
        "bytes_by_layer": by_layer,
        "count_by_layer": counts,
        "layers": {k: ("recorded" if v else "not recorded") for k, v in layers.items()},
        "by_process": records(procs),
        "by_stack": records(stacks),
        "by_size_class": records(sizes),
        "growth": records(grow),
        "growing_pids": growing[:rows],
        "growth_by_allocator": records(a_grow),
        "allocator_sites": records(a_segs),
        "rm_virtual_unreleased": {"count": int(virt_df["count"][0]),
                                  "bytes": int(virt_df["size_bytes"][0] or 0)}
        if layers["rm"] else None,
        "rm_freed_by_fd_close": {"count": int(closed_df["count"][0]),
                                 "bytes": int(closed_df["size_bytes"][0] or 0)}
        if layers["rm"] else None,
        # what each process held when it exited or the trace ended: one figure each
        "held_at_end": {"bytes": held_total, "processes": records(held)},
        "filters": {"older_s": o.older_ns / 1e9, "min_size_bytes": o.min_size_bytes,
                    "top": o.top},
    }
    if inp.has("syscall") or inp.has("rm_query"):
        from gputrace.analyses.holders import Facts, instants_report

        # who still holds the device files at the end, and memory no live process owns
        data["no_live_owner"] = instants_report(Facts(inp), [("end", inp.end_ns, None)])[0]
    if left_out:  # lists cut at --top or MAX_ROWS: how many rows each did not list
        data["left_out"] = left_out
    if groups is not None:  # held bytes per pod (or container), layers a breakdown
        data[f"by_{o.by}"] = records(groups if o.top is None else groups.head(o.top))
    for k, v in layers.items():
        if not v:
            warnings.append(f"leaks: layer {k} not recorded; its allocations are unknown")
    return Report("leaks", QUESTION, True, data, missing, warnings)
