"""What does every analysis receive from a trace, and what doubts about it does every
report carry?

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
from gputrace.analyses.helpers.sites import SiteFilter
from gputrace.trace.reader import CHOSEN_SIZES, SIZE_LIMIT


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
    ioctl_commands: pl.DataFrame | None = None
    """The distinct (device_code, nr, device, name) of the ioctls, from the parts'
    footers (`schema.IOCTL_COMMANDS`) when every part holds them; None: unknown. A
    superset of the rows' commands when `tables` were filtered."""
    site_filter: SiteFilter | None = None
    """The user's own code when it is a package (`--site-filter`; helpers/sites.py);
    None: every frame outside libraries, torch and the interpreter is the user's."""

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
    """The trace directory's own integrity warnings (`gputrace.trace.reader.trace_warnings`:
    rows or parts the manifest announces but the directory lacks, rows outside
    the time span), where this version of tracedir has them."""
    from gputrace.trace import reader as tracedir

    check = getattr(tracedir, "trace_warnings", None)
    if check is None or not isinstance(trace, tracedir.Trace):
        return []
    return [str(w) for w in check(trace)]


ALLOCATOR_SOURCES = ("snapshot", "live")
"""Where a trace's allocator rows came from, the default first when both are there."""
_SOURCE_TABLES = ("allocator_segments", "allocator_blocks", "allocator_events")


def allocator_sources(trace: Any) -> dict[str, dict[str, pl.LazyFrame]] | None:
    """A trace holding both a live allocator layer and a snapshot imported `--into` it:
    each source's allocator_segments, _blocks and _events (the snapshot's parts are
    named in its `imported` entry, torch_join.py). None when it holds one source."""
    entry = next((e for e in trace.manifest.get("imported") or []
                  if isinstance(e, dict) and isinstance(e.get("allocator_sources"), dict)),
                 None)
    if entry is None or not hasattr(trace, "parts"):
        return None
    named = entry["allocator_sources"].get("snapshot_parts") or {}
    out: dict[str, dict[str, pl.LazyFrame]] = {"snapshot": {}, "live": {}}
    for name in _SOURCE_TABLES:
        mine = set(named.get(name) or [])
        parts = trace.parts(name)
        out["snapshot"][name] = trace.scan(name, [p for p in parts if p.name in mine])
        out["live"][name] = trace.scan(name, [p for p in parts if p.name not in mine])
    return out


def inputs_from_trace(trace: Any, allocator_source: str | None = None) -> Inputs:
    """Inputs of a `gputrace.trace.reader.Trace` (scans stay lazy; manifest and footers are read).

    A trace with allocator rows from both the live layer and a snapshot gives the
    analyses one of them (`allocator_source`, the snapshot by default) and every
    report says so. A time span the manifest lacks is taken from the rows. One whose end is
    before its start would give negative durations and absurd rates: the rows'
    span is used instead and every report warns.
    """
    m = trace.manifest
    tables = {name: trace.scan(name) for name in schema.TABLES}
    problems = _trace_problems(trace)
    sources = allocator_sources(trace)
    if sources is not None:
        pick = allocator_source or ALLOCATOR_SOURCES[0]
        other = next(s for s in ALLOCATOR_SOURCES if s != pick)
        tables.update(sources[pick])
        problems.append(
            f"the trace holds the caching allocator twice (recorded live by the "
            f"torch_allocator layer and an imported snapshot): the allocator reports read "
            f"the {pick} rows; the {other} rows are not counted")
    for name, cols in CHOSEN_SIZES.items():
        if name.startswith("allocator_"):  # the API and driver sizes: helpers/lifetimes.py
            tables[name] = tables[name].with_columns(_possible(c) for c in cols)
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
        ioctl_commands=_ioctl_commands(trace),
    )


def _possible(col: str) -> pl.Expr:
    """`col` with a size past SIZE_LIMIT (a traced process's, or a forged trace's) as 0
    bytes, as the API layer's: one past 2^63 made every allocator analysis fail its
    signed sums ("u64 to i64 failed"); trace_warnings says how many and the largest."""
    c = pl.col(col)
    return pl.when(c > SIZE_LIMIT).then(pl.lit(0, pl.UInt64)).otherwise(c).alias(col)


def _ioctl_commands(trace: Any) -> pl.DataFrame | None:
    """`Inputs.ioctl_commands` of a trace whose parts all carry the set (a trace served
    from elsewhere, with no `part_set`, has none)."""
    part_set = getattr(trace, "part_set", None)
    ps = schema.IOCTL_COMMANDS
    rows = part_set("ioctls", ps.key) if part_set is not None else None
    if rows is None:
        return None
    types = schema.IOCTLS.polars_schema
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in ps.columns]
    # an impossible value (a code past its type) reads as null, which ioctl_stats refuses
    return pl.DataFrame([pl.Series(c, list(v), dtype=types[c], strict=False)
                         for c, v in zip(ps.columns, columns, strict=True)])


def _untracked_managed(m: dict[str, Any]) -> int:
    """Managed blocks whose CPU faults the in-kernel filter could not watch, unless every
    process that initialized UVM had a tools tracker (its CPU faults come from the driver's
    own stream then, and nothing is missing)."""
    source = ((m.get("driver_layer") or {}).get("cpu_fault_source") or {})
    if isinstance(source, dict) and source.get("uvm_pids_without_tracker") == []:
        return 0
    return sum(int(v or 0) for v in (m.get("cpu_faults") or {}).values())


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
