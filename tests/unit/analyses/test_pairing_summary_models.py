"""The two queries analyze is benchmarked on against DuckDB, checked against plain models
on random (synthetic) frames: as-of pairing of allocations with frees, and the ioctl
summary's counts, totals and exact nearest-rank quantiles."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl
import pytest

from gputrace import schema
from gputrace.analyses.helpers.pairing import pair
from gputrace.analyses.summary import ioctl_stats

KEY = ["pid", "h"]


def _events(seed: int, n: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Allocations (unique times per key, some null keys) and frees (double frees, frees
    before any allocation, frees at an allocation's own time) over a few reused keys."""
    rng = np.random.default_rng(seed)
    ts = rng.permutation(np.arange(n, dtype=np.int64) * 10)[: n // 2]
    allocs = pl.DataFrame({
        "id": np.arange(len(ts)), "ts_ns": ts,
        "pid": rng.integers(1, 3, len(ts)).astype(np.int32),
        "h": pl.Series(rng.integers(0, 4, len(ts)), dtype=pl.UInt32),
        "size_bytes": rng.integers(1, 100, len(ts)),
    }).with_columns(h=pl.when(pl.col("id") % 17 == 5).then(None).otherwise("h"))
    m = n - len(ts)
    # half of the frees land exactly on some allocation's time (ties: allocation first)
    fts = np.where(rng.random(m) < 0.5, rng.choice(ts, m), rng.integers(0, n * 10, m))
    frees = pl.DataFrame({
        "ts_ns": fts.astype(np.int64), "pid": rng.integers(1, 3, m).astype(np.int32),
        "h": pl.Series(rng.integers(0, 4, m), dtype=pl.UInt32),
    }).with_columns(h=pl.when(pl.int_range(pl.len()) % 13 == 3).then(None).otherwise("h"))
    return allocs, frees


def _model(allocs: pl.DataFrame, frees: pl.DataFrame) -> dict[int, int | None]:
    """Each free, in time order, ends the latest allocation of its key made at or before
    it, unless that allocation already ended (a double free ends nothing)."""
    out: dict[int, int | None] = {a["id"]: None for a in allocs.iter_rows(named=True)}
    rows = [a for a in allocs.iter_rows(named=True) if a["h"] is not None]
    for f in sorted(frees.iter_rows(named=True), key=lambda r: r["ts_ns"]):
        if f["h"] is None:
            continue
        mine = [a for a in rows if (a["pid"], a["h"]) == (f["pid"], f["h"])
                and a["ts_ns"] <= f["ts_ns"]]
        if mine:
            latest = max(mine, key=lambda a: a["ts_ns"])
            if out[latest["id"]] is None:
                out[latest["id"]] = f["ts_ns"]
    return out


@pytest.mark.parametrize("seed", range(6))
def test_pair_matches_the_as_of_model(seed: int) -> None:
    allocs, frees = _events(seed, 400)
    got = pair(allocs.lazy(), frees.lazy(), KEY).collect()
    assert got.height == allocs.height
    assert sorted(got.columns) == sorted([*allocs.columns, "free_ts_ns"])
    ends = dict(zip(got["id"].to_list(), got["free_ts_ns"].to_list(), strict=True))
    assert ends == _model(allocs, frees)
    # every allocation row comes back unchanged
    assert got.select(allocs.columns).sort("id").equals(allocs)


def _ioctls(seed: int, n: int) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    device = rng.choice(["ctl", "gpu", "uvm"], n)
    lat = rng.integers(1, 40, n) * 100
    cols: dict[str, Any] = {
        "ts_ns": np.arange(n, dtype=np.int64), "device": device,
        "device_code": pl.Series([{"ctl": 1, "gpu": 2, "uvm": 3}[d] for d in device],
                                 dtype=pl.UInt8),
        "gpu_index": pl.Series(rng.integers(0, 3, n), dtype=pl.Int16),
        "name": rng.choice(["RM_ALLOC", "RM_FREE", "RM_CONTROL"], n),
        "ret": np.where(rng.random(n) < 0.05, -22, 0),
        "status": pl.Series(np.where(rng.random(n) < 0.1, 0x1F, 0), dtype=pl.UInt32),
        "latency_ns": lat.astype(np.int64), "_untimed": rng.random(n) < 0.1,
    }
    df = pl.DataFrame(cols).with_columns(
        latency_ns=pl.when("_untimed").then(None).otherwise("latency_ns")).drop("_untimed")
    # one command whose calls all lack a latency
    df = df.with_columns(latency_ns=pl.when(pl.col("name") == "RM_FREE")
                         .then(pl.when(pl.col("device") == "uvm").then(None)
                               .otherwise("latency_ns")).otherwise("latency_ns"))
    full = schema.table("ioctls").polars_schema
    return df.select([pl.col(c).cast(t) if c in df.columns else pl.lit(None, t).alias(c)
                      for c, t in full.items()])


def _reference(df: pl.DataFrame) -> pl.DataFrame:
    keys = ["device", "gpu_index", "name"]
    lat = pl.col("latency_ns")
    failed = (pl.col("status").fill_null(0) != 0) | (pl.col("ret").fill_null(0) < 0)
    return (df.with_columns(gpu_index=pl.when(pl.col("device") == "gpu").then("gpu_index"))
            .group_by(keys).agg(
                pl.len().alias("count"), failed.sum().alias("failed"),
                lat.sum().alias("total_ns"), lat.mean().alias("mean_ns"),
                *[lat.quantile(q, "nearest").cast(pl.Float64).alias(f"latency_ns_p{p}")
                  for q, p in ((0.5, 50), (0.9, 90), (0.99, 99))],
                lat.max().alias("latency_ns_max")))


@pytest.mark.parametrize("seed", range(4))
def test_ioctl_stats_match_direct_aggregation(seed: int) -> None:
    df = _ioctls(seed, 3000)
    got = ioctl_stats(df.lazy()).collect()
    want = _reference(df)
    keys = ["device", "gpu_index", "name"]
    assert got.schema == want.schema
    assert got.sort(keys).equals(want.sort(keys))
    # rows come by total time, largest first
    assert got["total_ns"].to_list() == sorted(got["total_ns"].to_list(), reverse=True)


def test_ioctl_stats_of_no_calls() -> None:
    empty = pl.DataFrame(schema=schema.table("ioctls").polars_schema)
    got = ioctl_stats(empty.lazy()).collect()
    assert got.height == 0
    assert got.schema == _reference(empty).schema
