"""What did memory, faults and call latency do over time, in few enough points to plot?

Plots of a 100 M-event trace cannot carry every event, so every series here is
downsampled by one rule (docs/reports.md): the trace's time span is cut into
`buckets` equal buckets and each series keeps, per bucket, its lowest and its
highest value at the times they happened (min/max decimation, as oscilloscopes
and tsdownsample's MinMax do). Peaks and troughs therefore survive exactly, a
leak's staircase keeps its shape, and a series never has more than
2 x `buckets` points whatever the trace's size. Rates are counts per bucket
divided by the bucket's length. A layer that was not recorded gives
`recorded: false` and no points, never a flat zero line.

Everything returned is JSON-ready; renderers only draw it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from gputrace import schema
from gputrace.analyses.allocations import COUNTED
from gputrace.analyses.growth import BINS, live_series, theil_sen
from gputrace.analyses.helpers.common import NS_PER_MIN, NS_PER_S, Inputs, chunk_bytes
from gputrace.analyses.helpers.lifetimes import lifetimes, memory
from gputrace.analyses.helpers.partition import Slice, per_slice
from gputrace.analyses.helpers.stacks import stack_frames

BUCKETS = 1000
"""Default buckets per plot: at most 2000 points per series."""
MAX_SERIES = 12
"""Series drawn per plot, largest peak first; the rest are counted in `omitted`."""
LATENCY_EDGES_US = [10.0 ** (e / 4) for e in range(-4, 29)]
"""Latency histogram bucket edges: 4 per decade from 0.1 us to 10 s."""
LATENCY_COMMANDS = 8


def table_recorded(inp: Inputs, table: str) -> bool:
    """Could the trace hold rows of `table` (one of the layers that write it recorded)?"""
    return any(inp.has(layer) for layer in schema.table(table).layers)


def _bucket(inp: Inputs, buckets: int) -> pl.Expr:
    span = max(inp.end_ns - inp.start_ns, 1)
    return ((pl.col("ts_ns") - inp.start_ns).clip(0, span) * buckets // (span + 1))


def decimate(series: pl.LazyFrame, key: list[str], value: str, inp: Inputs,
             buckets: int) -> pl.DataFrame:
    """Min/max decimation of step series (`key`, ts_ns, `value`): per key and bucket, the
    lowest and the highest value at the times they occurred, in time order."""
    per = (series.with_columns(_b=_bucket(inp, buckets))
           .group_by([*key, "_b"])
           .agg(t_lo=pl.col("ts_ns").get(pl.col(value).arg_min()), lo=pl.col(value).min(),
                t_hi=pl.col("ts_ns").get(pl.col(value).arg_max()), hi=pl.col(value).max()))
    lo = per.select(*key, pl.col("t_lo").alias("ts_ns"), pl.col("lo").alias(value))
    hi = per.select(*key, pl.col("t_hi").alias("ts_ns"), pl.col("hi").alias(value))
    return pl.concat([lo, hi]).unique().sort([*key, "ts_ns", value]).collect()


def _t_s(inp: Inputs, ts: pl.Series) -> list[float]:
    return [round((int(t) - inp.start_ns) / NS_PER_S, 6) for t in ts]


def _series_list(inp: Inputs, df: pl.DataFrame, key: list[str], value: str,
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
                   t_s=_t_s(inp, g["ts_ns"]), values=[int(v) for v in g[value]],
                   peak=int(g[value].max() or 0),  # type: ignore[arg-type]
                   end=int(g[value][-1]))
        out.append(row)
    return {"recorded": True, "series": out, "omitted": len(groups) - len(keep)}


def _fit_lines(inp: Inputs, series: pl.DataFrame, flagged: set[tuple[str, int]]
               ) -> list[dict[str, Any]]:
    """The growth fit of each flagged (layer, pid), as two end points: the Theil-Sen line
    through the same 32 per-bin troughs the leak report's growth test fits."""
    lines = []
    for (layer, pid), g in series.group_by(["layer", "pid"], maintain_order=True):
        if (layer, pid) not in flagged:
            continue
        ts = g["ts_ns"].to_numpy()
        live = g["live_bytes"].to_numpy()
        t0, t1 = int(ts.min()), int(ts.max())
        if t1 <= t0:
            continue
        b = (ts - t0) * BINS // (t1 - t0 + 1)
        x, y, carried = [], [], 0.0
        for k in range(BINS):
            hit = live[b == k]
            if hit.size:
                x.append(k * (t1 - t0) / NS_PER_MIN / BINS)
                y.append(min(float(hit.min()), carried))
                carried = float(hit[-1])
        if len(x) < 3:
            continue
        slope, icpt, _, _ = theil_sen(np.array(x), np.array(y))
        dur = (t1 - t0) / NS_PER_MIN
        lines.append({"layer": layer, "pid": pid, "slope_bytes_per_min": slope,
                      "t_s": _t_s(inp, pl.Series([t0, t1])),
                      "values": [icpt, icpt + slope * dur]})
    return lines


def live_bytes(inp: Inputs, buckets: int = BUCKETS,
               flagged: set[tuple[str, int]] | None = None,
               max_series: int | None = MAX_SERIES) -> dict[str, Any]:
    """Live bytes per (layer, pid) over time, with growth fit lines for `flagged` series."""
    if not (inp.has("api") or inp.has("syscall")):
        return {"recorded": False, "series": [], "omitted": 0, "fits": []}
    lt = memory(lifetimes(inp))
    full = live_series(lt).collect()
    comms = (lt.group_by("layer", "pid").agg(pl.col("comm").drop_nulls().first()).collect())
    names = {(r["layer"], r["pid"]): f"{r['layer']} {r['comm'] or '?'} ({r['pid']})"
             for r in comms.iter_rows(named=True)}
    out = _series_list(inp, decimate(full.lazy(), ["layer", "pid"], "live_bytes", inp,
                                     buckets), ["layer", "pid"], "live_bytes", names,
                       max_series)
    out["fits"] = _fit_lines(inp, full, flagged or set())
    return out


def gpu_bytes(inp: Inputs, buckets: int = BUCKETS) -> dict[str, Any]:
    """Bytes in use per GPU over time: PMM chunks when the driver layer has them, else
    RM allocations that name their GPU."""
    src = "pmm chunks"
    ev: pl.LazyFrame | None = None
    if inp.has("driver"):
        size = chunk_bytes()
        delta = (pl.when(pl.col("chunk_op") == "alloc").then(size)
                 .when(pl.col("chunk_op").is_in(["free", "evict"])).then(-size).otherwise(0))
        ev = inp.scan("chunks").select("gpu_index", "ts_ns", delta.alias("delta"))
        if ev.select(pl.len()).collect().item() == 0:
            ev = None
    if ev is None and inp.has("syscall"):
        src = "rm allocations"
        lt = memory(lifetimes(inp)).filter((pl.col("layer") == "rm")
                                           & pl.col("gpu_index").is_not_null())
        ev = pl.concat([
            lt.select("gpu_index", pl.col("alloc_ts_ns").alias("ts_ns"),
                      pl.col("size_bytes").alias("delta")),
            lt.filter(pl.col("free_ts_ns").is_not_null()).select(
                "gpu_index", pl.col("free_ts_ns").alias("ts_ns"),
                (-pl.col("size_bytes")).alias("delta"))])
    if ev is None:
        return {"recorded": False, "source": None, "series": [], "omitted": 0}
    steps = (ev.with_columns(pl.col("gpu_index").cast(pl.Int64), pl.col("delta").cast(pl.Int64))
             .sort(pl.col("ts_ns") * 2 + (pl.col("delta") > 0).cast(pl.Int64))
             .with_columns(used_bytes=pl.col("delta").cum_sum().over("gpu_index")))
    df = decimate(steps, ["gpu_index"], "used_bytes", inp, buckets)
    out = _series_list(inp, df, ["gpu_index"], "used_bytes", {})
    for s in out["series"]:
        s["name"] = f"GPU {s['gpu_index']}"
    out["source"] = src
    return out


def _rate(inp: Inputs, frame: pl.LazyFrame, by: str | None, buckets: int
          ) -> list[dict[str, Any]]:
    span = max(inp.end_ns - inp.start_ns, 1)
    width_s = span / buckets / NS_PER_S
    keys = ["_b"] if by is None else [by, "_b"]
    df = (frame.with_columns(_b=_bucket(inp, buckets)).group_by(keys).agg(n=pl.len())
          .sort(keys).collect())
    out = []
    groups = [((None,), df)] if by is None else list(df.group_by(by, maintain_order=True))
    for k, g in groups:
        # every bucket, empty ones as 0: a rate holds no value across a gap
        counts = [0] * buckets
        for b, n in zip(g["_b"], g["n"], strict=True):
            counts[int(b)] = int(n)
        out.append({"name": None if by is None else str(k[0]),
                    "t_s": [round(b * width_s, 6) for b in range(buckets)],
                    "per_s": [round(n / width_s, 6) for n in counts],
                    "events": sum(counts)})
    return out


def rate_buckets(inp: Inputs, window_s: float | None, most: int = BUCKETS) -> int:
    """Buckets for rates: the fault-rate report's window when it gives at most `most`
    buckets (so plot and table agree on the busiest window), else `most`."""
    if not window_s:
        return most
    span_s = max(inp.end_ns - inp.start_ns, 1) / NS_PER_S
    return max(1, min(most, -int(-span_s // window_s)))


def fault_rates(inp: Inputs, buckets: int = BUCKETS) -> dict[str, Any]:
    """CPU faults, GPU faults, fault batches and migrations (by cause) per second."""
    faults = inp.scan("faults")
    span_s = max(inp.end_ns - inp.start_ns, 1) / NS_PER_S

    def part(recorded: bool, frame: pl.LazyFrame, by: str | None) -> dict[str, Any]:
        if not recorded:
            return {"recorded": False, "series": []}
        return {"recorded": True, "series": _rate(inp, frame, by, buckets)}

    return {"bucket_s": round(span_s / buckets, 9),
            "cpu_faults": part(inp.has("cpu_faults"),
                               faults.filter(pl.col("source") == "cpu"), None),
            "gpu_faults": part(inp.has("driver") or inp.has("uvm_tools"),
                               faults.filter(pl.col("source") != "cpu"), "source"),
            "fault_batches": part(table_recorded(inp, "fault_batches"),
                                  inp.scan("fault_batches"), None),
            "migrations": part(table_recorded(inp, "migrations"), inp.scan("migrations"),
                               "cause")}


def latency_histograms(inp: Inputs) -> dict[str, Any]:
    """ioctl latency distribution of the busiest commands: counts per log-spaced bucket,
    bucket i holding latencies from `from_us[i]` (0 for the first) to `edges_us[i]`."""
    if not inp.has("syscall"):
        return {"recorded": False, "edges_us": LATENCY_EDGES_US, "commands": [],
                "from_us": []}
    edges_ns = [e * 1000 for e in LATENCY_EDGES_US]
    io = (inp.scan("ioctls").filter(pl.col("latency_ns").is_not_null())
          .select(pl.col("name").fill_null("?"), "latency_ns"))
    top = (io.group_by("name").agg(n=pl.len()).sort(["n", "name"], descending=[True, False])
           .head(LATENCY_COMMANDS).collect())
    names = list(top["name"])
    df = (io.filter(pl.col("name").is_in(names))
          # bucket i: latencies in [edge i-1, edge i); bucket 0 below the first edge
          .with_columns(_b=pl.sum_horizontal([(pl.col("latency_ns") >= e).cast(pl.Int64)
                                              for e in edges_ns]))
          .group_by("name", "_b").agg(n=pl.len()).collect())
    cmds = []
    for name in names:
        counts = [0] * (len(edges_ns) + 1)
        for b, n in df.filter(pl.col("name") == name).select("_b", "n").iter_rows():
            counts[int(b)] = int(n)
        cmds.append({"name": name, "counts": counts})
    return {"recorded": True, "edges_us": LATENCY_EDGES_US, "commands": cmds,
            "from_us": [LATENCY_EDGES_US[0] / 10, *LATENCY_EDGES_US]}


def _slice_stacks(sl: Slice, allocated: bool) -> pl.DataFrame:
    """Bytes by (layer, pid, stack or driver label) of one pid slice, from its
    allocations model: leaked API allocations by stack and, for processes without API
    calls, leaked driver allocations (`class` unattributed) by what they are; with
    `allocated`, every API allocation and every driver allocation, leaked or not."""
    r, pieces = sl.model(held_only=not allocated)
    api = r.filter(pl.col("layer") == "api")
    drv = pieces.filter(pl.col("class") != "api")
    if allocated:
        drv_bytes = pl.when(pl.col("rm_count") > 0).then("rm_bytes").otherwise("uvm_bytes")
    else:
        # the leak headline: API bytes of leaked API allocations, driver bytes of
        # unattributed pieces; driver-made memory of API processes is not a leak
        api = api.filter(pl.col("kind").is_not_null())
        drv = drv.filter(pl.col("kind").is_not_null() & (pl.col(COUNTED) > 0))
        drv_bytes = pl.col(COUNTED)
    by_stack = api.group_by("pid", "stack_id").agg(
        layer=pl.lit("api"), bytes=pl.col("size_bytes").sum(), count=pl.len(),
        comm=pl.col("comm").drop_nulls().first(), what=pl.lit(None, pl.String))
    by_what = drv.with_columns(layer=pl.when(pl.col("rm_count") > 0).then(pl.lit("rm"))
                               .otherwise(pl.lit("uvm")), _b=drv_bytes).group_by(
        "layer", "pid", "what").agg(
        bytes=pl.col("_b").sum(), count=pl.len(), comm=pl.col("comm").drop_nulls().first(),
        stack_id=pl.lit(None, pl.Int64))
    cols = ["layer", "pid", "stack_id", "what", "comm", "bytes", "count"]
    return pl.concat([by_stack.select(cols), by_what.select(cols)], how="vertical_relaxed")


def folded_stacks(inp: Inputs, allocated: bool = False) -> list[dict[str, Any]]:
    """Bytes by call stack from the joined allocations model (each piece of memory told
    once): leaked bytes as the leak headline counts them (their sum is
    `leaks.total_bytes`) or, with `allocated`, every allocation. One row per (layer,
    pid, stack): frames outermost first; driver memory has `[no stack]` and its kind."""
    parts = per_slice(inp, {"s": lambda sl: _slice_stacks(sl, allocated)})["s"]
    agg = (pl.concat(parts, how="vertical_relaxed").filter(pl.col("bytes") > 0)
           .with_columns(pl.col("stack_id").cast(pl.Int64)))
    frames = (stack_frames(inp.scan("stacks")).collect() if inp.has("api") else
              pl.DataFrame(schema={"pid": pl.Int32, "stack_id": pl.Int64,
                                   "frames": pl.String}))
    df = (agg.join(frames.with_columns(pl.col("stack_id").cast(pl.Int64)),
                   on=["pid", "stack_id"], how="left")
          .sort(["bytes", "layer", "pid", "stack_id", "what"],
                descending=[True, False, False, False, False], nulls_last=True))
    out = []
    for r in df.iter_rows(named=True):
        inner_first = r["frames"].split(" < ") if r["frames"] else ["[no stack]"]
        if r["what"] is not None:
            inner_first.insert(0, str(r["what"]))
        out.append({"layer": r["layer"], "pid": r["pid"], "comm": r["comm"] or "?",
                    "stack_id": r["stack_id"], "frames": inner_first[::-1],
                    "bytes": int(r["bytes"]), "count": int(r["count"])})
    return out


TREE_STACKS = 200
"""Stacks drawn in the leak icicle; the rest form one "other stacks" node per layer."""


def icicle(rows: list[dict[str, Any]], most: int = TREE_STACKS) -> dict[str, list[Any]]:
    """Folded stacks as a tree (ids, labels, parents, values) for an icicle plot:
    layer, then process, then frames outermost first; a node's value is its subtree's.
    Past `most` stacks, the rest of each layer is one node, so the tree's total is
    every row's (the leak headline, for leaked rows)."""
    value: dict[str, int] = {}
    label: dict[str, str] = {}
    parent: dict[str, str] = {}
    rest: dict[str, list[int]] = {}
    for r in rows[most:]:
        acc = rest.setdefault(r["layer"], [0, 0])
        acc[0] += r["bytes"]
        acc[1] += 1
    paths = [([r["layer"], f"{r['comm']} ({r['pid']})", *r["frames"]], r["bytes"])
             for r in rows[:most]]
    paths += [([layer, f"{n:,} other stacks"], b) for layer, (b, n) in rest.items()]
    for path, nbytes in paths:
        node = ""
        for depth, name in enumerate(path):
            child = f"{node}/{depth}:{name}"
            label.setdefault(child, name)
            parent.setdefault(child, node)
            value[child] = value.get(child, 0) + nbytes
            node = child
    ids = list(value)
    return {"ids": ids, "labels": [label[i] for i in ids], "parents": [parent[i] for i in ids],
            "values": [value[i] for i in ids]}


def plot_series(inp: Inputs, doc: dict[str, Any], buckets: int = BUCKETS) -> dict[str, Any]:
    """Every series the HTML report draws, next to the report document `doc`."""
    leaks = doc.get("leaks") or {}
    flagged = {(g["layer"], g["pid"]) for g in leaks.get("growth") or [] if g.get("flagged")}
    rows = folded_stacks(inp)
    fr = doc.get("fault_rate") or {}
    return {"buckets": buckets, "live_bytes": live_bytes(inp, buckets, flagged),
            "gpu_bytes": gpu_bytes(inp, buckets),
            "fault_rates": fault_rates(inp, rate_buckets(inp, fr.get("window_s"), buckets)),
            "latency": latency_histograms(inp), "leak_stacks": rows[:200],
            "leak_tree": icicle(rows)}


TIMELINE_BUCKETS = 2_000
"""Counter points per series in the Perfetto timeline (min/max decimated like the plots)."""


def timeline(inp: Inputs, buckets: int = TIMELINE_BUCKETS) -> dict[str, Any]:
    """What the Perfetto timeline shows: call rows (slices), fault and migration rows
    (instants) as lazy frames in time order, and counter series."""
    threads = pl.concat([inp.scan(t).select("pid", "tid", "comm") for t in
                         ("ioctls", "cuda_calls")]).unique(["pid", "tid"], keep="first")
    names = (inp.scan("processes").select("pid", pl.col("comm").alias("process"))
             .unique("pid", keep="first"))
    return {
        "start_ns": inp.start_ns,
        "threads": threads.join(names, on="pid", how="left").sort("pid", "tid"),
        "ioctls": inp.scan("ioctls").select(
            "ts_ns", "pid", "tid", pl.col("name").fill_null("ioctl"), "latency_ns",
            "size_bytes", pl.col("h_object").alias("handle"), "status", "ret", "gpu_index"),
        "cuda_calls": inp.scan("cuda_calls").select(
            "ts_ns", "pid", "tid", pl.col("func").fill_null("cuda"), "latency_ns",
            "size_bytes", "ptr", "handle", "result"),
        "faults": inp.scan("faults").select("ts_ns", "pid", "source", "access_type",
                                            "gpu_index", "address"),
        "migrations": inp.scan("migrations").select("ts_ns", "pid", "cause", "src", "dst",
                                                    "size_bytes", "address"),
        "live_bytes": live_bytes(inp, buckets, max_series=None),
        "gpu_bytes": gpu_bytes(inp, buckets),
        "fault_rates": fault_rates(inp, min(buckets, 2000)),
    }
