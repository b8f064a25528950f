"""The ioctl summary's packed-integer histogram: packing round-trips, and the summary it
feeds equals the one grouped by the names on every kind of table, including those where
the names are not a function of the integer codes (the names path is then taken)."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl
import pytest

from gputrace import schema
from gputrace.analyses.helpers.packed_keys import Field, Packing
from gputrace.analyses.summary import _by_names, _command_packing, ioctl_stats

KEYS = ["device", "gpu_index", "name"]
UVM_INIT = 0x30000001  # a real UVM command number: too wide to pack with long latencies
COMMANDS = [  # (device_code, device, nr, name), one name per (device_code, nr)
    (1, "ctl", 0x2B, "RM_ALLOC"), (1, "ctl", 0x29, "RM_FREE"), (2, "gpu", 0x2A, "RM_CONTROL"),
    (1, "ctl", 0x2A, "RM_CONTROL"), (3, "uvm", UVM_INIT, "UVM_INITIALIZE"),
    (3, "uvm", 0x15, "UVM_MAP_EXTERNAL_ALLOCATION"),
]


def _reference(df: pl.DataFrame) -> pl.DataFrame:
    lat = pl.col("latency_ns")
    failed = (pl.col("status").fill_null(0) != 0) | (pl.col("ret").fill_null(0) < 0)
    return (df.with_columns(gpu_index=pl.when(pl.col("device") == "gpu").then("gpu_index"))
            .group_by(KEYS).agg(
                pl.len().alias("count"), failed.sum().alias("failed"),
                lat.sum().alias("total_ns"), lat.mean().alias("mean_ns"),
                *[lat.quantile(q, "nearest").cast(pl.Float64).alias(f"latency_ns_p{p}")
                  for q, p in ((0.5, 50), (0.9, 90), (0.99, 99))],
                lat.max().alias("latency_ns_max")))


def _ioctls(seed: int, n: int, commands: list[tuple[int, str, int, str]] = COMMANDS,
            lat_scale: int = 100) -> pl.DataFrame:
    """Calls of `commands` with failures, untimed calls, gpu_index on every device kind
    (masked outside "gpu" by the summary) and repeated latencies."""
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(commands), n)
    lat = rng.integers(0, 50, n) * lat_scale
    cols: dict[str, Any] = {
        "ts_ns": np.arange(n, dtype=np.int64),
        "device_code": pl.Series([commands[i][0] for i in pick], dtype=pl.UInt8),
        "device": [commands[i][1] for i in pick],
        "nr": pl.Series([commands[i][2] for i in pick], dtype=pl.UInt32),
        "name": [commands[i][3] for i in pick],
        "gpu_index": pl.Series(rng.integers(0, 3, n), dtype=pl.Int16),
        "ret": np.where(rng.random(n) < 0.05, -22, 0),
        "status": pl.Series(np.where(rng.random(n) < 0.1, 0x1F, 0), dtype=pl.UInt32),
        "latency_ns": lat.astype(np.int64),
    }
    df = pl.DataFrame(cols).with_columns(
        gpu_index=pl.when(pl.int_range(pl.len()) % 7 == 0).then(None).otherwise("gpu_index"),
        latency_ns=pl.when(pl.int_range(pl.len()) % 11 == 0).then(None)
        .otherwise("latency_ns"))
    full = schema.table("ioctls").polars_schema
    return df.select([pl.col(c).cast(t) if c in df.columns else pl.lit(None, t).alias(c)
                      for c, t in full.items()])


def _packing(df: pl.DataFrame) -> Packing | None:
    lat, gpu = pl.col("latency_ns"), pl.col("gpu_index")
    commands = df.select("device_code", "nr", "device", "name").unique()
    ranges = df.select(lat.min().alias("lat_lo"), lat.max().alias("lat_hi"),
                       gpu.min().alias("gpu_lo"), gpu.max().alias("gpu_hi"))
    return _command_packing(commands, ranges)


def _check(df: pl.DataFrame) -> None:
    got = ioctl_stats(df.lazy()).collect()
    want = _reference(df)
    assert got.schema == want.schema
    assert got.sort(KEYS, nulls_last=True).equals(want.sort(KEYS, nulls_last=True))
    assert got["total_ns"].to_list() == sorted(got["total_ns"].to_list(), reverse=True)
    names = _by_names(df.lazy()).collect()
    assert got.sort(KEYS, nulls_last=True).equals(names.sort(KEYS, nulls_last=True))


@pytest.mark.parametrize("seed", range(3))
def test_packed_path_equals_the_names(seed: int) -> None:
    df = _ioctls(seed, 4000)
    p = _packing(df)
    assert p is not None and all(f.modulus is None for f in p.fields)
    _check(df)


def test_wide_command_numbers_fold_into_few_values() -> None:
    # latencies up to ~2**40 ns leave no room for a 30-bit nr: it is packed as nr % p
    df = _ioctls(7, 3000, lat_scale=1 << 34)
    p = _packing(df)
    assert p is not None
    assert next(f for f in p.fields if f.name == "_nr").modulus is not None
    _check(df)


def test_name_not_a_function_of_the_codes_takes_the_names_path() -> None:
    # the same (device_code, nr) under two names: grouping by codes would merge them
    clash = [*COMMANDS, (1, "ctl", 0x2B, "RM_ALLOC_OTHER")]
    df = _ioctls(3, 3000, clash)
    assert _packing(df) is None
    _check(df)


def test_device_not_a_function_of_the_code_takes_the_names_path() -> None:
    # code 2 is "gpu" for one command and "ctl" for another: the GPU mask needs the name
    mixed = [*COMMANDS, (2, "ctl", 0x2B, "RM_ALLOC")]
    df = _ioctls(4, 3000, mixed)
    assert _packing(df) is None
    _check(df)


def test_null_codes_take_the_names_path() -> None:
    df = _ioctls(5, 2000).with_columns(
        nr=pl.when(pl.int_range(pl.len()) == 3).then(None).otherwise("nr"))
    assert _packing(df) is None
    _check(df)


def test_no_calls() -> None:
    empty = pl.DataFrame(schema=schema.table("ioctls").polars_schema)
    got = ioctl_stats(empty.lazy()).collect()
    assert got.height == 0
    assert got.schema == _reference(empty).schema


def test_untimed_and_single_command_tables() -> None:
    one = [(2, "gpu", 0x2A, "RM_CONTROL")]
    df = _ioctls(6, 500, one).with_columns(latency_ns=pl.lit(None, pl.Int64))
    assert _packing(df) is not None
    _check(df)


@pytest.mark.parametrize("c_first", [False, True])
@pytest.mark.parametrize("lo", [0, -5, 1 << 61])
def test_packing_round_trips(lo: int, c_first: bool) -> None:
    # with c most significant and lo = 2**61, x * stride would overflow: the key is then
    # built field by field from codes
    rng = np.random.default_rng(lo & 0xFFFF)
    n = 1000
    df = pl.DataFrame({
        "a": pl.Series(rng.integers(0, 3, n), dtype=pl.UInt8),
        "b": pl.Series(rng.integers(0, 40, n), dtype=pl.Int16),
        "c": pl.Series(lo + rng.integers(0, 1000, n), dtype=pl.Int64),
        "w": pl.Series([UVM_INIT if x else 7 for x in rng.random(n) < 0.5], dtype=pl.UInt32),
    }).with_columns(b=pl.when(pl.int_range(pl.len()) % 5 == 0).then(None).otherwise("b"),
                    c=pl.when(pl.int_range(pl.len()) % 9 == 0).then(None).otherwise("c"))
    fields = [Field("a", pl.col("a"), 0, 3, nullable=False),
              Field("w", pl.col("w"), 0, 61, nullable=False, modulus=61),
              Field("b", pl.col("b"), 0, 40)]
    c = Field("c", pl.col("c"), lo, 1000)
    p = Packing.of([c, *fields] if c_first else [*fields, c])
    assert p is not None
    back = df.select(p.key().alias("k")).select(p.unpack("k"))
    assert back["a"].cast(pl.UInt8).equals(df["a"])
    assert back["b"].cast(pl.Int16).equals(df["b"])
    assert back["c"].equals(df["c"])
    assert back["w"].to_list() == [x % 61 for x in df["w"].to_list()]
    # distinct rows get distinct keys
    assert (df.select(p.key().alias("k"))["k"].n_unique()
            == df.with_columns(w=pl.col("w") % 61).unique().height)


def test_packing_that_would_not_fit_is_refused() -> None:
    wide = Field("x", pl.col("x"), 0, 1 << 40)
    assert Packing.of([wide, wide]) is None
    assert Packing.of([wide, Field("y", pl.col("y"), 0, 1 << 20)]) is not None
