"""What every analysis receives, and the helpers they share.

`Inputs` is the whole contract between a trace and the analyses: lazy scans
of each table plus the few manifest facts the reports need (time span, GPU
memory, layers recorded, status, drops) and the doubts about the trace found
while opening it. Building it reads the manifest and the parts' footers;
every analysis is then a pure function of an `Inputs` (and of frames other
analyses returned), so tests can feed them hand-made frames.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from gputrace import schema

MiB = 1 << 20
BLOCK_2M = 2 * MiB
NS_PER_S = 1_000_000_000
NS_PER_MIN = 60 * NS_PER_S


@dataclass(frozen=True)
class Inputs:
    """Lazy tables of one trace and the manifest facts analyses rely on."""

    tables: Mapping[str, pl.LazyFrame]
    layers: tuple[str, ...]
    start_ns: int
    end_ns: int
    gpu_memory_bytes: tuple[int, ...] = ()
    status: str = "complete"
    drops: Mapping[str, int] = field(default_factory=dict)
    synthetic: bool = False
    untracked_managed: int = 0
    """Managed 2 MiB blocks and ranges the CPU-fault filter could not hold."""
    problems: tuple[str, ...] = ()
    """Doubts about the trace itself (rows missing or outside its time span, a bad
    time span), one line each; every report carries them."""

    def scan(self, name: str) -> pl.LazyFrame:
        if name in self.tables:
            return self.tables[name]
        return pl.LazyFrame(schema=schema.table(name).polars_schema)

    def has(self, layer: str) -> bool:
        return layer in self.layers


_EVENT_TABLES = ("ioctls", "mappings", "cuda_calls", "faults", "migrations", "chunks")


def _data_span(tables: Mapping[str, pl.LazyFrame]) -> tuple[int | None, int | None]:
    stamps = [tables[n].select(pl.col("ts_ns").min().alias("a"), pl.col("ts_ns").max()
                               .alias("b")) for n in _EVENT_TABLES if n in tables]
    span = pl.concat(pl.collect_all(stamps)).select(pl.col("a").min(), pl.col("b").max())
    a, b = span["a"][0], span["b"][0]
    return (None if a is None else int(a)), (None if b is None else int(b))


def _trace_problems(trace: Any) -> list[str]:
    """The trace directory's own integrity warnings (`gputrace.tracedir.trace_warnings`:
    rows or parts the manifest announces but the directory lacks, rows outside
    the time span), where this version of tracedir has them."""
    from gputrace import tracedir

    check = getattr(tracedir, "trace_warnings", None)
    if check is None or not isinstance(trace, tracedir.Trace):
        return []
    return [str(w) for w in check(trace)]


def inputs_from_trace(trace: Any) -> Inputs:
    """Inputs of a `gputrace.tracedir.Trace` (scans stay lazy; manifest and footers are read).

    A time span the manifest lacks is taken from the rows. One whose end is
    before its start would give negative durations and absurd rates: the rows'
    span is used instead and every report warns.
    """
    m = trace.manifest
    tables = {name: trace.scan(name) for name in schema.TABLES}
    problems = _trace_problems(trace)
    start, end = m.get("start_ts_ns"), m.get("end_ts_ns")
    if isinstance(start, int) and isinstance(end, int) and end < start:
        problems.append(f"the manifest's end_ts_ns ({end}) is before its start_ts_ns "
                        f"({start}); durations and rates use the rows' own time span instead")
        start = end = None
    if not isinstance(start, int) or not isinstance(end, int):
        a, b = _data_span(tables)
        start = start if isinstance(start, int) else (a or 0)
        end = end if isinstance(end, int) else (b if b is not None else start)
        end = max(end, start)
    gpus = sorted(m.get("gpus", []), key=lambda g: int(g.get("index", 0)))
    return Inputs(
        tables=tables,
        layers=tuple(trace.layers),
        start_ns=start,
        end_ns=end,
        gpu_memory_bytes=tuple(int(g.get("memory_bytes") or 0) for g in gpus),
        status=trace.status,
        drops=trace.drops,
        synthetic=bool(m.get("synthetic", False)),
        untracked_managed=_untracked_managed(m),
        problems=tuple(problems),
    )


def _untracked_managed(m: dict[str, Any]) -> int:
    """Managed blocks whose CPU faults the in-kernel filter could not watch, unless every
    process that initialized UVM had a tools tracker (its CPU faults come from the driver's
    own stream then, and nothing is missing)."""
    source = ((m.get("driver_layer") or {}).get("cpu_fault_source") or {})
    if isinstance(source, dict) and source.get("uvm_pids_without_tracker") == []:
        return 0
    return sum(int(v or 0) for v in (m.get("cpu_faults") or {}).values())


def pair(allocs: pl.LazyFrame, frees: pl.LazyFrame, by: list[str]) -> pl.LazyFrame:
    """`allocs` (with `ts_ns`) plus `free_ts_ns`, paired on the key columns `by`.

    As-of semantics: each free matches the latest allocation of its key at or
    before it, and an allocation keeps the first free that matched it. With
    allocations and frees sorted together by (key, time, allocation first), that
    is: an allocation's free is the next row, when the next row is a free of the
    same key. One sort, no join.
    """
    f = frees.select(*by, "ts_ns").drop_nulls(by).with_columns(_free=pl.lit(True))
    both = pl.concat([allocs.with_columns(_free=pl.lit(False)), f], how="diagonal_relaxed")
    # Sort on a 64-bit hash of the key and on time*2 + is_free: two columns sort
    # much faster than the key's; `same` below still compares the real key.
    both = both.sort(pl.struct(by).hash(), pl.col("ts_ns") * 2 + pl.col("_free").cast(pl.Int64))
    same = pl.lit(True)
    for k in by:
        same = same & (pl.col(k) == pl.col(k).shift(-1)).fill_null(False)
    nxt = pl.col("_free").shift(-1).fill_null(False) & same
    return (both.with_columns(free_ts_ns=pl.when(nxt).then(pl.col("ts_ns").shift(-1)))
            .filter(~pl.col("_free")).drop("_free"))


def trace_warnings(inp: Inputs) -> list[str]:
    """Warnings every report carries: an unfinished recording, lost events, and doubts
    about the trace itself (`Inputs.problems`)."""
    out = []
    if inp.status != "complete":
        out.append(f"trace status is {inp.status!r}, not 'complete': the recorder did not "
                   "finish, so the last rotation interval may be missing and frees may "
                   "be absent")
    lost = sum(inp.drops.values())
    if lost:
        detail = ", ".join(f"{k}={v}" for k, v in sorted(inp.drops.items()) if v)
        out.append(f"{lost} events were dropped by full ring buffers ({detail}); "
                   "counts are lower bounds and a dropped free looks like a leak")
    return out + list(inp.problems)


def ok_ioctl() -> pl.Expr:
    """An ioctl that succeeded: NV_OK status (or none) and a non-negative return."""
    return (pl.col("status").fill_null(0) == 0) & (pl.col("ret").fill_null(0) >= 0)


def chunk_bytes() -> pl.Expr:
    """Bytes of a PMM chunk: 2 ** log2_size."""
    return pl.lit(2, pl.Int64).pow(pl.col("log2_size").cast(pl.UInt32))


def size_class(col: str = "size_bytes") -> pl.Expr:
    """Readable size class: the power-of-two bucket a size falls in."""
    s = pl.col(col).cast(pl.Int64)
    return (
        pl.when(s <= 4096).then(pl.lit("<=4KiB"))
        .when(s <= 64 * 1024).then(pl.lit("<=64KiB"))
        .when(s <= BLOCK_2M).then(pl.lit("<=2MiB"))
        .when(s <= 32 * MiB).then(pl.lit("<=32MiB"))
        .when(s <= 512 * MiB).then(pl.lit("<=512MiB"))
        .otherwise(pl.lit(">512MiB"))
    )


def records(df: pl.DataFrame) -> list[dict[str, Any]]:
    """A frame as JSON-ready rows (floats rounded so output is stable)."""
    out = df.with_columns(pl.col(pl.Float64, pl.Float32).round(6)).to_dicts()
    return out


def quantiles(col: str, prefix: str = "") -> list[pl.Expr]:
    """Exact p50/p90/p99 and max of a column (as nsys stats reports them)."""
    c = pl.col(col)
    return [
        c.quantile(0.5, "nearest").alias(f"{prefix}p50"),
        c.quantile(0.9, "nearest").alias(f"{prefix}p90"),
        c.quantile(0.99, "nearest").alias(f"{prefix}p99"),
        c.max().alias(f"{prefix}max"),
    ]
