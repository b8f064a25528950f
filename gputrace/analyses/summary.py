"""Which driver calls cost what, and who holds how much memory where?

- ioctls: count, failures and latency quantiles per device kind, GPU and
  command, like `nsys stats`' API summaries (exact quantiles, nearest rank).
- held: each process's one figure from the joined allocation model (each piece of
  memory once, sized by one layer: allocations/held.py): its peak, what it held at the
  trace's end (process still running), its classes at the end as attributes;
  `--by pod|container` adds these up per group.
- processes: the per-layer breakdown: peak and live (at trace end, process still
  running) bytes per layer and process, replayed from allocation lifetimes (each
  layer alone: the layers see the same memory, never add them).
- GPUs: peak and final allocated bytes per GPU from PMM chunk events (driver
  layer; alloc adds 2^log2_size, free and evict subtract), or from RM
  allocations whose GPU is known; imbalance = max / mean of allocated bytes.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import polars as pl

from gputrace.analyses.allocations.held import CLASS_KEYS, held_pieces
from gputrace.analyses.allocations.rows import with_exits
from gputrace.analyses.helpers.common import records
from gputrace.analyses.helpers.gpus import gpu_table, pmm_gpus, replay_steps
from gputrace.analyses.helpers.identity import by_identity
from gputrace.analyses.helpers.inputs import Inputs, trace_warnings
from gputrace.analyses.helpers.lifetimes import VIRTUAL_LAYERS
from gputrace.analyses.helpers.packed_keys import Field, Packing
from gputrace.analyses.helpers.partition import Slice, per_slice
from gputrace.analyses.helpers.scans import few_row_groups_ahead
from gputrace.analyses.leaks.growth import live_series
from gputrace.analyses.registry import unrecorded
from gputrace.analyses.report import Report
from gputrace.analyses.report_spec import DiffTable, FleetUse, ReportSpec

if TYPE_CHECKING:
    from gputrace.analyses.registry import Context


def _pmm(ctx: Context) -> Any:
    return ctx.memo("pmm_gpus", lambda: pmm_gpus(ctx.inp))


def _part(ctx: Context, sl: Slice) -> Any:
    return summary_part(sl, _pmm(ctx) is None)


def _run(ctx: Context) -> Report:
    return summary(ctx.inp, ctx.parts("summary"), _pmm(ctx), ctx.opts.by)


_SECTIONS = "gputrace.render.html_sections"
_SUMMARY_HELD = ("processes", "live_end_bytes", "sum_of_peaks_bytes", "program_bytes",
                 "allocator_pool_bytes", "cuda_context_bytes", "driver_only_bytes", "pieces",
                 "api_layer_live_end_bytes", "rm_layer_live_end_bytes",
                 "uvm_layer_live_end_bytes")
"""`summary --by pod|container`: what the group held at the end (one figure per process,
the joined model: summary.held_memory), its processes' peaks added, its classes, then
what each layer alone showed at the end (a breakdown)."""

SPEC = ReportSpec(
    "summary", "summary", "Summary",
    "Which driver calls cost what, and who holds how much GPU memory, on which GPU?",
    ("api", "driver", "syscall"), _run, _part, prepare=_pmm,
    terminal="gputrace.render.terminal:summary_section",
    html=(f"{_SECTIONS}:gpu_bytes", f"{_SECTIONS}:ioctl_latency"),
    columns={"by_pod": ("pod_namespace", "pod_name", *_SUMMARY_HELD, "pod_uid", "qos_class"),
             "by_container": ("pod_namespace", "pod_name", "container_name", *_SUMMARY_HELD,
                              "container_id", "container_runtime", "pod_uid")},
    diff=(DiffTable("process_peaks", "Peak per process", ("processes",), ("layer", "comm"),
                    ("peak_bytes", "live_end_bytes"), is_bytes=True),
          DiffTable("gpu_peaks", "Peak per GPU", ("gpus", "gpus"), ("gpu_index",),
                    ("peak_bytes", "end_bytes"), is_bytes=True),
          DiffTable("ioctl_latency", "ioctl latency per command", ("ioctls",),
                    ("name", "device", "gpu_index"),
                    ("count", "failed", "latency_ns_p50", "latency_ns_p90",
                     "latency_ns_p99", "latency_ns_max"),
                    shown=("count", "latency_ns_p50", "latency_ns_p99", "latency_ns_max"),
                    add_up=False)),
    fleet=FleetUse(why_not="per-process and per-GPU figures of one trace: pids and GPU "
                           "indices name different things on different hosts"), place=60)
QUESTION = SPEC.question


def ioctl_stats(ioctls: pl.LazyFrame, commands: pl.DataFrame | None = None) -> pl.LazyFrame:
    """Per (device, gpu_index, name): calls, failures, latency total and quantiles (ns).

    Exact nearest-rank quantiles (as `Expr.quantile(q, "nearest")`: rank
    round((n - 1) q), half away from zero) from a histogram of (group, latency)
    counts: the q-quantile is the least latency whose running count exceeds the
    rank. Latencies repeat, so the histogram is far smaller than the calls and
    nothing holds every call's latency per group. Calls, failures and the total
    come from the same histogram, then one group_by of the histogram.

    The histogram is most of the cost (~100 k groups at 6 M calls). Cheap scans first
    find the latency and gpu_index ranges and the table's distinct (device_code, nr,
    device, name), which `commands` gives instead when known (`Inputs.ioctl_commands`,
    from the parts' footers: a superset of the rows' commands will do); when the names
    are a function of the codes, as the recorder writes them, the histogram groups by
    one Int64 packing the codes, the GPU, the failure flag and the latency
    (`_command_packing`: polars hashes one word per row instead of row-encoding two
    strings), and the names join the ~10 result rows. Otherwise it groups by the names
    themselves. Every scan runs with few row groups decoded ahead
    (`few_row_groups_ahead`)."""
    lat, gpu = pl.col("latency_ns"), pl.col("gpu_index")
    with few_row_groups_ahead():
        # Apart: ranges as aggregations of the grouped query cost more than a second,
        # vectorized pass over two integer columns.
        if commands is None:
            commands = ioctls.select("device_code", "nr", "device", "name").unique().collect()
        ranges = ioctls.select(lat.min().alias("lat_lo"), lat.max().alias("lat_hi"),
                               gpu.min().alias("gpu_lo"), gpu.max().alias("gpu_hi")).collect()
    packing = _command_packing(commands, ranges)
    if packing is None:
        return _by_names(ioctls)
    c = pl.col("_c")
    with few_row_groups_ahead():
        packed = ioctls.group_by(packing.key().alias("_k")).agg(pl.len().alias("_c")).collect()
    # Sorted by the packed key, a (command, GPU)'s rows come by latency, the null bin
    # last (the latency's highest code), failed calls beside the others.
    hist = (packed.lazy().sort("_k").select(*packing.unpack("_k"), c)
            .with_columns(_f=pl.when(pl.col("_failed") == 1).then(c).otherwise(0)))
    nr = next(f for f in packing.fields if f.name == "_nr")
    names = commands.select(pl.col("device_code").cast(pl.Int64), nr.unpacked(), "device",
                            "name")
    return _finish(_summarize(hist, ["device_code", "_nr", "gpu_index"])
                   .join(names.lazy(), on=["device_code", "_nr"], how="left")
                   .select("device", pl.col("gpu_index").cast(pl.Int16), "name", *_STATS))


_STATS = ["count", "failed", "total_ns", "mean_ns", "latency_ns_p50", "latency_ns_p90",
          "latency_ns_p99", "latency_ns_max"]


def _finish(stats: pl.LazyFrame) -> pl.LazyFrame:
    """The rows by total time, largest first, computed here by the in-memory engine: the
    histogram is a small frame, on which it is ~10 ms faster than the streaming one."""
    return (stats.sort("total_ns", "device", "name", descending=[True, False, False],
                       nulls_last=True)
            .collect(engine="in-memory").lazy())


def _failed() -> pl.Expr:
    """A failed call: an NV_STATUS other than NV_OK, or a negative return."""
    return (pl.col("status").fill_null(0) != 0) | (pl.col("ret").fill_null(0) < 0)


def _by_names(ioctls: pl.LazyFrame) -> pl.LazyFrame:
    """`ioctl_stats` from a histogram grouped by the names (any table)."""
    keys = ["device", "gpu_index", "name"]
    # gpu_index names the /dev/nvidiaN file; on nvidiactl rows it can hold the GPU a
    # device object was allocated for, which is no reason to split a command's row.
    with few_row_groups_ahead():
        hist = (ioctls.with_columns(gpu_index=pl.when(pl.col("device") == "gpu")
                                    .then("gpu_index"))
                .group_by(*keys, "latency_ns")
                .agg(pl.len().alias("_c"), _failed().sum().alias("_f")).collect())
    return _finish(_summarize(hist.lazy().sort("latency_ns", nulls_last=True), keys))


def _summarize(hist: pl.LazyFrame, keys: list[str]) -> pl.LazyFrame:
    """The statistics per `keys` from histogram rows (keys, latency_ns, _c calls, _f
    failed calls) that come, within each group, by latency with the null bin last: the
    running count at a timed bin then counts timed calls only. A latency may span more
    than one row (failed calls apart): running counts still pass a rank at the same
    least latency."""
    lat, c = pl.col("latency_ns"), pl.col("_c")
    timed = lat.is_not_null()
    n = c.filter(timed).sum()
    total = (lat * c).sum()

    def q(p: float, name: str) -> pl.Expr:
        rank = ((n - 1).cast(pl.Float64) * p).round(0, "half_away_from_zero")
        return lat.filter(timed & (c.cum_sum() > rank)).min().cast(pl.Float64).alias(name)

    # total / timed calls is lat.mean(): the total is exact (an integer far below 2**53)
    return hist.group_by(keys).agg(
        c.sum().alias("count"), pl.col("_f").sum().alias("failed"), total.alias("total_ns"),
        pl.when(n > 0).then(total / n).alias("mean_ns"),
        q(0.5, "latency_ns_p50"), q(0.9, "latency_ns_p90"), q(0.99, "latency_ns_p99"),
        lat.max().alias("latency_ns_max"))


_MODULI = (61, 127, 251, 509, 1021, 2039, 4093, 8191, 16381, 32749, 65521)
"""Primes tried to fold a wide `nr` (UVM commands are 0x3000000x) into few values."""


def _command_packing(commands: pl.DataFrame, ranges: pl.DataFrame) -> Packing | None:
    """The Int64 packing of (device_code, nr, gpu_index, latency_ns, failed) for a table
    with the distinct (device_code, nr, device, name) `commands` and the latency and
    gpu_index `ranges` (lat_lo, lat_hi, gpu_lo, gpu_hi); None when the names are not a
    function of (device_code, nr), a code is null, device "gpu" is not a function of
    device_code, or no packing fits in 63 bits.

    gpu_index is packed null outside device "gpu" (as `_by_names` masks it), so such
    rows share a bin. `nr` is packed as is when that fits, else as `nr % p` for the
    least prime p in `_MODULI` that keeps every command apart."""
    if commands.height == 0 or commands.select(
            pl.col("device_code").is_null().any() | pl.col("nr").is_null().any()).item():
        return None
    codes = commands.select("device_code", "nr")
    if codes.n_unique() != commands.height:
        return None
    kinds = commands.select("device_code", is_gpu=pl.col("device") == "gpu").unique()
    if kinds["device_code"].n_unique() != kinds.height or kinds["is_gpu"].is_null().any():
        return None
    gpu_codes = kinds.filter("is_gpu")["device_code"].to_list()

    def span(frame: pl.DataFrame, lo: str, hi: str) -> tuple[int, int]:
        """(least value, count of values up to the greatest) of integer columns."""
        a, b = frame.select(pl.col(lo).min().alias("a"), pl.col(hi).max().alias("b")).row(0)
        return (0, 0) if a is None or b is None else (int(a), int(b) - int(a) + 1)

    g_lo, g_span = span(ranges, "gpu_lo", "gpu_hi") if gpu_codes else (0, 0)
    is_gpu = (pl.col("device_code") == gpu_codes[0] if len(gpu_codes) == 1
              else pl.col("device_code").is_in(gpu_codes))
    gpu = pl.when(is_gpu).then(pl.col("gpu_index"))
    rest = [Field("gpu_index", gpu, g_lo, g_span),
            Field("latency_ns", pl.col("latency_ns"), *span(ranges, "lat_lo", "lat_hi")),
            Field("_failed", _failed(), 0, 2, nullable=False)]
    device = Field("device_code", pl.col("device_code"),
                   *span(commands, "device_code", "device_code"), nullable=False)
    plain = Packing.of([device, Field("_nr", pl.col("nr"), *span(commands, "nr", "nr"),
                                      nullable=False), *rest])
    if plain is not None:
        return plain
    for m in _MODULI:
        if m >= commands.height and codes.select(
                "device_code", pl.col("nr").cast(pl.Int64) % m).n_unique() == commands.height:
            return Packing.of([device, Field("_nr", pl.col("nr"), 0, m, nullable=False,
                                             modulus=m), *rest])
    return None


def process_memory(lt: pl.LazyFrame, processes: pl.LazyFrame) -> pl.LazyFrame:
    """Per (layer, pid, comm): peak live bytes and bytes live at trace end (unsorted)."""
    peak = live_series(lt).group_by("layer", "pid").agg(
        pl.col("live_bytes").max().alias("peak_bytes"))
    live = (with_exits(lt, processes, "alloc_ts_ns")
            .with_columns(comm=pl.coalesce("pcomm", "comm"),
                          live=pl.col("free_ts_ns").is_null() & pl.col("exit_ts_ns").is_null())
            .group_by("layer", "pid")
            .agg(pl.col("comm").drop_nulls().first(), pl.len().alias("allocations"),
                 pl.col("size_bytes").filter("live").sum().alias("live_end_bytes")))
    return live.join(peak, on=["layer", "pid"])


HELD_FIGURES = ("peak_bytes", "live_end_bytes", "pieces", *CLASS_KEYS.values())
"""The columns of `held_memory` that add up over processes (a pod's, a container's)."""
LAYER_BREAKDOWN = tuple(f"{k}_layer_live_end_bytes" for k in ("api", "rm", "uvm"))
"""`--by`: what each layer alone shows live at the end (a breakdown, never added)."""


def held_memory(sl: Slice) -> pl.DataFrame:
    """Per pid of the slice, from the joined model (each piece once): `comm`, the peak
    of what it held, what it held at the trace's end (running), its pieces, and its
    classes at the end (`CLASS_KEYS`, adding up to `live_end_bytes`)."""
    held = held_pieces(sl)
    until = pl.coalesce("until_ns", "exit_ts_ns")
    steps = pl.concat([
        held.select("pid", pl.col("from_ns").alias("ts_ns"), pl.col("held_bytes").alias("d")),
        held.filter(until.is_not_null()).select(
            "pid", until.alias("ts_ns"), (-pl.col("held_bytes")).alias("d"))])
    # at equal times the frees first: a piece freed as another is made is not a peak
    peak = (steps.sort(pl.col("ts_ns") * 2 + (pl.col("d") > 0).cast(pl.Int64))
            .with_columns(level=pl.col("d").cum_sum().over("pid"))
            .group_by("pid").agg(pl.col("level").max().alias("peak_bytes")))
    end = (pl.col("until_ns").is_null() & pl.col("exit_ts_ns").is_null()).cast(pl.Int64)
    size = pl.col("held_bytes") * end
    return (held.group_by("pid")
            .agg(pl.col("comm").drop_nulls().last(), size.sum().alias("live_end_bytes"),
                 pl.len().alias("pieces"),
                 *[(size * (pl.col("class") == c)).sum().alias(k)
                   for c, k in CLASS_KEYS.items()])
            .join(peak, on="pid", how="left")
            .select("pid", "comm", *HELD_FIGURES))


def summary_part(sl: Slice, rm_gpu: bool) -> dict[str, pl.DataFrame]:
    """What one pid slice adds: its processes' memory and, when `rm_gpu`, the
    (gpu_index, ts_ns, d) steps of its RM allocations with a known GPU."""
    inp = sl.inp
    lt = sl.lifetimes.filter(~pl.col("layer").is_in(list(VIRTUAL_LAYERS)))
    rm = (lt.filter((pl.col("layer") == "rm") & pl.col("gpu_index").is_not_null()
                    & pl.lit(rm_gpu))
          .select("gpu_index", pl.col("alloc_ts_ns").alias("ts_ns"), "size_bytes",
                  "free_ts_ns"))
    steps = pl.concat([
        rm.select("gpu_index", "ts_ns", pl.col("size_bytes").alias("d")),
        rm.filter(pl.col("free_ts_ns").is_not_null()).select(
            "gpu_index", pl.col("free_ts_ns").alias("ts_ns"), (-pl.col("size_bytes")).alias("d"))
    ])
    procs, steps_df = pl.collect_all([process_memory(lt, inp.scan("processes")), steps])
    return {"processes": procs, "rm_gpu": steps_df, "held": held_memory(sl)}


def summary(inp: Inputs, parts: list[dict[str, pl.DataFrame]] | None = None,
            pmm: pl.DataFrame | None = None, by: str | None = None) -> Report:
    """The summary report, from the `summary_part` of each pid slice (computed when not
    given; `pmm` must then be `pmm_gpus(inp)` and the parts' `rm_gpu` follow it); `by`:
    memory per process also added up per "pod" or "container" (the peaks summed are
    each process's own: at most the group's peak, never less)."""
    warnings = trace_warnings(inp)
    if (absent := unrecorded(SPEC, inp, warnings)) is not None:
        return absent
    if parts is None:
        pmm = pmm_gpus(inp)
        step = functools.partial(summary_part, rm_gpu=pmm is None)
        parts = per_slice(inp, {"summary": step})["summary"]
    io = ioctl_stats(inp.scan("ioctls"), inp.ioctl_commands).collect()
    procs = pl.concat([p["processes"] for p in parts]).sort(
        "layer", "peak_bytes", "pid", descending=[False, True, False])
    held = pl.concat([p["held"] for p in parts]).sort(
        "peak_bytes", "pid", descending=[True, False])
    if pmm is not None:
        gpus: dict[str, object] | None = gpu_table(inp, pmm, "pmm chunks")
    elif (rm_gpus := replay_steps(pl.concat([p["rm_gpu"] for p in parts]))).height:
        gpus = gpu_table(inp, rm_gpus, "rm allocations")
    else:
        gpus = None
        warnings.append("summary: per-GPU memory needs PMM chunk events (driver layer) or "
                        "RM allocations with a known GPU; none in this trace")
    missing = [x for x in SPEC.layers if not inp.has(x)]
    data = {
        "ioctls": records(io) if inp.has("syscall") else None,
        "held": records(held),
        "processes": records(procs),
        "gpus": gpus,
    }
    if by is not None:
        # each process's one figure added up; the layers as a labelled breakdown
        layer = procs.group_by("pid").agg(
            *[(pl.col("live_end_bytes") * (pl.col("layer") == k.split("_")[0])).sum()
              .cast(pl.Int64).alias(k) for k in LAYER_BREAKDOWN])
        frame = held.join(layer, on="pid", how="left").with_columns(
            pl.col(list(LAYER_BREAKDOWN)).fill_null(0))
        data[f"by_{by}"] = records(by_identity(
            frame.lazy(), inp.scan("processes"), by,
            ["live_end_bytes", "peak_bytes", *HELD_FIGURES[2:], *LAYER_BREAKDOWN])
            .rename({"peak_bytes": "sum_of_peaks_bytes"}).collect())
    return Report("summary", QUESTION, True, data, missing, warnings)
