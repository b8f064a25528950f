"""What memory did the program leak, each piece told once, and where was it asked for?

Reads the `allocations` model (one row per piece of memory, its layers joined).
The headline is ONE number, `total_bytes`: the API bytes of leaked API
allocations, plus, for processes whose API calls the trace lacks, the bytes of
their leaked driver allocations (the RM object, else its UVM mappings). Memory
the driver made for a process that used the API, outside any API allocation (the
CUDA context and runtime), is `driver_held`: reported with its size, never in the
headline. Address-space reservations are `reservations`, never memory.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from gputrace.analyses.allocations.pieces import COUNTED
from gputrace.analyses.allocations.rows import leak_kind, with_exits
from gputrace.analyses.helpers.allocators import ALLOCATORS, CACHED, PROGRAM, stack_allocators
from gputrace.analyses.helpers.common import records
from gputrace.analyses.helpers.partition import Slice
from gputrace.analyses.helpers.stacks import stack_sites
from gputrace.analyses.helpers.uvm_ranges import UVM_VIRTUAL_LAYER

JOINED = ["pid", "comm", "kind", "class", "what", "api_count", "bytes", "rm_what",
          "rm_handle", "rm_bytes", "uvm_base", "uvm_bytes", "gpu_index", "alloc_ts_ns",
          "age_s", "stack_id", "frames", "site", "api_ids", "freed_by"]


def _driver_bytes() -> pl.Expr:
    return pl.when(pl.col("rm_count") > 0).then("rm_bytes").otherwise("uvm_bytes")


def _uniform(col: str) -> pl.Expr:
    """The one value of `col` in the group, or null when they differ."""
    return pl.when(pl.col(col).n_unique() == 1).then(pl.col(col).first())


def joined_part(sl: Slice, older_ns: int, min_size: int) -> dict[str, pl.DataFrame]:
    """The joined leak findings of one pid slice."""
    inp = sl.inp
    r, pieces = sl.model(held_only=True)
    end = pl.coalesce("exit_ts_ns", pl.lit(inp.end_ns))
    ids = (r.filter((pl.col("layer") == "api") & pl.col("kind").is_not_null())
           .sort("_row").group_by("piece").agg(pl.col("id").alias("api_ids")))
    frames = stack_sites(inp).collect()
    owners = stack_allocators(inp.scan("stacks")).select(
        "pid", "stack_id", "allocator").collect()
    leaked = (pieces.filter((pl.col(COUNTED) > 0) & pl.col("kind").is_not_null())
              .with_columns(bytes=pl.col(COUNTED),
                            api_count=pl.col("api_leaked_count"),
                            stack_id=pl.col("leak_stack_id"),
                            age_s=(end - pl.col("alloc_ts_ns")) / 1e9)
              .filter((pl.col("age_s") * 1e9 >= older_ns) & (pl.col("bytes") >= min_size))
              .join(frames, on=["pid", "stack_id"], how="left")
              .join(ids, on="piece", how="left")
              .with_columns(pl.col("api_ids").fill_null(pl.lit([], pl.List(pl.UInt64))))
              .join(owners, on=["pid", "stack_id"], how="left")
              .with_columns(pl.col("allocator").fill_null(PROGRAM)))
    # Memory a caching allocator keeps by design (freed at exit) is told apart, never
    # counted in the headline: the headline is what the program leaked.
    by_design = pl.col("allocator").is_in(CACHED)
    kept = (leaked.filter(by_design).group_by("allocator")
            .agg(pl.len().cast(pl.Int64).alias("count"), pl.col("bytes").sum()))
    leaked = leaked.filter(~by_design)
    # leak sites: leaked API allocations by call stack, with the driver memory they sit in
    backing = leaked.select("piece", "rm_count", "rm_bytes")
    api_rows = (r.filter((pl.col("layer") == "api") & pl.col("kind").is_not_null())
                .join(backing, on="piece")
                .join(owners, on=["pid", "stack_id"], how="left")
                .filter(~pl.col("allocator").fill_null(PROGRAM).is_in(CACHED)))
    api_sites = api_rows.group_by("pid", "stack_id").agg(
        pl.col("comm").first(), pl.len().cast(pl.Int64).alias("count"),
        pl.col("size_bytes").sum().alias("bytes"), _uniform("size_bytes").alias("size_bytes"),
        pl.col("what").first(),
        pl.col("piece").filter(pl.col("rm_count") > 0).n_unique().cast(pl.Int64)
        .alias("backing_count"))
    per_piece = api_rows.filter(pl.col("rm_count") > 0).unique("piece").group_by(
        "pid", "stack_id").agg(pl.col("rm_bytes").sum().alias("backing_bytes"),
                               _uniform("rm_bytes").alias("backing_size_bytes"))
    api_sites = api_sites.join(per_piece, on=["pid", "stack_id"], how="left",
                               nulls_equal=True)
    drv_sites = (leaked.filter(pl.col("class") == "unattributed")
                 .group_by("pid", "what").agg(
                     pl.col("comm").first(), pl.len().cast(pl.Int64).alias("count"),
                     pl.col("bytes").sum(), _uniform("bytes").alias("size_bytes"))
                 .with_columns(stack_id=pl.lit(None, pl.Int64),
                               backing_count=pl.lit(0, pl.Int64),
                               backing_bytes=pl.lit(None, pl.Int64),
                               backing_size_bytes=pl.lit(None, pl.Int64)))
    sites = pl.concat([api_sites, drv_sites], how="diagonal_relaxed").join(
        frames, on=["pid", "stack_id"], how="left")
    held = (pieces.filter((pl.col("class") == "driver") & pl.col("kind").is_not_null())
            .group_by("kind").agg(pl.len().cast(pl.Int64).alias("count"),
                                  _driver_bytes().sum().alias("bytes")))
    lazy_res = with_exits(sl.lifetimes.filter(pl.col("layer").is_in(["rm-virtual",
                                                                 UVM_VIRTUAL_LAYER])),
                     inp.scan("processes"), "alloc_ts_ns").with_columns(kind=leak_kind())
    res = (lazy_res.filter(pl.col("kind").is_not_null()).group_by("layer")
           .agg(pl.len().cast(pl.Int64).alias("count"), pl.col("size_bytes").sum().alias(
               "bytes")).collect())
    return {"joined": leaked.select(JOINED), "sites": sites, "held": held, "reserved": res,
            "kept": kept}


FOLD_KEY = ["pid", "comm", "kind", "class", "what", "api_count", "bytes", "rm_what",
            "rm_bytes", "uvm_bytes", "gpu_index", "stack_id", "frames", "site", "freed_by"]
"""Leaked pieces that agree on all of these are one row of the joined view, with a
count (`pieces`): a person reads "12 x 2.0 MiB", not 12 identical rows."""


def fold(joined: pl.DataFrame) -> pl.DataFrame:
    """Identical leaked pieces (same `FOLD_KEY`) folded into one row: `pieces` counts
    them, `size_bytes` is the bytes of one, `api_count`, `bytes`, `rm_bytes` and
    `uvm_bytes` are their sums, `alloc_ts_ns` the first, `age_s` the oldest,
    `api_ids` all of them, `rm_handle` and `uvm_base` the one value, else null."""
    sums = ["api_count", "bytes", "rm_bytes", "uvm_bytes"]
    keys = [pl.col(c).alias(f"_k_{c}") for c in sums]
    out = (joined.with_columns(keys)
           .group_by([c if c not in sums else f"_k_{c}" for c in FOLD_KEY],
                     maintain_order=True)
           .agg(pl.len().cast(pl.Int64).alias("pieces"),
                *(pl.col(c).sum() for c in sums),
                pl.col("alloc_ts_ns").min(), pl.col("age_s").max(),
                pl.col("api_ids").list.explode(keep_nulls=False, empty_as_null=False)
                .alias("api_ids"),
                _uniform("rm_handle").alias("rm_handle"), _uniform("uvm_base").alias("uvm_base"))
           .with_columns(size_bytes=pl.col("_k_bytes"))
           .drop([f"_k_{c}" for c in sums]))
    return out.select(*JOINED, "pieces", "size_bytes")


def _add(parts: list[dict[str, pl.DataFrame]], name: str, key: str) -> dict[str, Any]:
    df = pl.concat([p[name] for p in parts], how="diagonal_relaxed")
    if df.is_empty():
        return {}
    df = df.group_by(key).agg(pl.col("count").sum(), pl.col("bytes").sum()).sort(key)
    return {row[key]: {"count": int(row["count"]), "bytes": int(row["bytes"] or 0)}
            for row in df.iter_rows(named=True)}


def _basis(joined: pl.DataFrame, api: bool) -> str:
    """What `total_bytes` counts: api (API allocation bytes), driver (driver allocation
    bytes: no API layer, or only processes without API calls leaked) or api+driver."""
    classes = set(joined["class"].to_list()) if joined.height else set()
    if not api or classes == {"unattributed"}:
        return "driver"
    return "api+driver" if "unattributed" in classes else "api"


def joined_report(parts: list[dict[str, pl.DataFrame]], top: int | None,
                  api: bool, max_rows: int) -> dict[str, Any]:
    """The joined leak view's JSON keys, from each slice's `joined_part`."""
    joined = pl.concat([p["joined"] for p in parts], how="diagonal_relaxed").sort(
        "bytes", "alloc_ts_ns", "pid", descending=[True, False, False])
    sites = pl.concat([p["sites"] for p in parts], how="diagonal_relaxed").sort(
        "bytes", "pid", "stack_id", descending=[True, False, False], nulls_last=True)
    total = int(joined["bytes"].sum() or 0)
    count = int(sites["count"].sum() or 0)
    held = _add(parts, "held", "kind")
    joined = fold(joined).sort("bytes", "alloc_ts_ns", "pid", descending=[True, False, False])
    rows = top if top is not None else max_rows
    cut = {k: v.height - rows for k, v in (("leaked", joined), ("leak_sites", sites))
           if v.height > rows}
    joined, sites = joined.head(rows), sites.head(rows)
    return {
        "total_bytes": total,
        "total_count": count,
        "total_basis": _basis(joined, api),
        "leaked": records(joined),
        "leak_sites": records(sites),
        "driver_held": {
            "count": sum(v["count"] for v in held.values()),
            "bytes": sum(v["bytes"] for v in held.values()),
            "by_kind": held,
        } if api else None,
        "reservations": _add(parts, "reserved", "layer"),
        "held_by_allocator": _kept(parts),
        "joined_left_out": cut,
    }


def _kept(parts: list[dict[str, pl.DataFrame]]) -> dict[str, Any]:
    """Unfreed API memory of caching allocators that keep it by design, per allocator:
    label, count and bytes (outside the headline)."""
    words = {a.name: a.label for a in ALLOCATORS}
    return {k: {"label": words[k], "cached_by_design": True, **v}
            for k, v in _add(parts, "kept", "allocator").items()}
