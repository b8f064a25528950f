"""`gputrace export`: many trace directories written as one partitioned dataset.

Layout (docs/fleet.md)::

    DEST/manifest.json                                  the dataset index
    DEST/traces/<trace_id>.json                         one record per trace
    DEST/<table>/date=YYYY-MM-DD/host=NAME/<trace_id>.parquet

A trace's files are named by its id, so writing it again overwrites, never
duplicates. The index is written last: a trace is in the dataset once the
index lists it, and an export stopped midway leaves the dataset as it was
plus files the next export overwrites.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import polars as pl
import pyarrow as pa

from gputrace import schema
from gputrace.fleet.store import DatasetError, Store
from gputrace.manifest import TRACE_ID_PATTERN

DATASET_FORMAT = "gputrace-fleet"
DATASET_VERSION = 1
INDEX = "manifest.json"
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
_ID_RE = re.compile(TRACE_ID_PATTERN)


def trace_id(m: dict[str, Any]) -> str:
    """Which recording is this? The manifest's own `trace_id` when it has one, else a
    hash of what a recording never changes while it runs (host, start, creation time,
    recorder pid), so a trace exported while `recording` and again once `complete`
    keeps its identity."""
    own = m.get("trace_id")
    if isinstance(own, str) and _ID_RE.fullmatch(own):
        return own
    key = [(m.get("host") or {}).get("hostname"), m.get("start_ts_ns"), m.get("created_unix_s"),
           (m.get("recorder") or {}).get("pid"), (m.get("clock") or {}).get("realtime_offset_ns")]
    return "t" + hashlib.sha256(json.dumps(key).encode()).hexdigest()[:24]


def start_date(m: dict[str, Any]) -> str | None:
    """UTC date the recording started (monotonic start + realtime offset, else creation)."""
    start, off = m.get("start_ts_ns"), (m.get("clock") or {}).get("realtime_offset_ns")
    if isinstance(start, int) and isinstance(off, int):
        secs: float = (start + off) / 1e9
    elif isinstance(m.get("created_unix_s"), (int, float)):
        secs = float(m["created_unix_s"])
    else:
        return None
    try:
        return dt.datetime.fromtimestamp(secs, dt.timezone.utc).date().isoformat()
    except (OverflowError, OSError, ValueError):
        return None


def gpu_model(m: dict[str, Any]) -> str | None:
    names = sorted({str(g["name"]) for g in m.get("gpus", []) if g.get("name")})
    return ", ".join(names) or None


def fingerprint(m: dict[str, Any]) -> str:
    """Changes whenever the trace does (a recording that went on, then completed)."""
    return hashlib.sha256(json.dumps(m, sort_keys=True).encode()).hexdigest()


def partition(date: str | None, host: str | None) -> str:
    return f"date={date or NULL_PARTITION}/host={quote(host, safe='') if host else NULL_PARTITION}"


@dataclass
class ExportResult:
    exported: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)


def read_index(store: Store, *, create: bool) -> dict[str, Any]:
    """The dataset index; a new empty one where `create` and nothing is there yet."""
    if not store.exists(INDEX):
        if create:
            return {"format": DATASET_FORMAT, "format_version": DATASET_VERSION,
                    "schema_version": schema.SCHEMA_VERSION,
                    "partitioning": list(schema.FLEET_PARTITIONS), "traces": {}}
        raise DatasetError(f"{store.url} is not a gputrace dataset (no {INDEX})")
    index = store.read_json(INDEX)
    if not isinstance(index, dict) or index.get("format") != DATASET_FORMAT:
        raise DatasetError(f"{store.url}/{INDEX} is not a gputrace dataset manifest")
    if not isinstance(index.get("format_version"), int) or \
            index["format_version"] > DATASET_VERSION:
        raise DatasetError(f"{store.url}: dataset format {index.get('format_version')!r} is "
                           f"not one this gputrace reads ({DATASET_VERSION})")
    if not isinstance(index.get("traces"), dict):
        raise DatasetError(f"{store.url}/{INDEX}: 'traces' is not an object")
    return index


def export_traces(paths: Iterable[str], store: Store,
                  note: Callable[[str], None] = lambda _: None) -> ExportResult:
    """Add traces to the dataset at `store`; a trace already there unchanged is skipped."""
    from gputrace.tracedir import open_trace

    index = read_index(store, create=True)
    done = ExportResult()
    try:
        for path in paths:
            t = open_trace(path, validate=False)  # the manifest decides; parts only if new
            tid = trace_id(t.manifest)
            old = index["traces"].get(tid)
            if old is not None and old.get("fingerprint") == fingerprint(t.manifest):
                done.unchanged.append(tid)
                continue
            t.validate()
            index["traces"][tid] = _write_trace(t, tid, store, old)
            (done.replaced if old is not None else done.exported).append(tid)
            note(f"exported {path} as {tid}")
    finally:
        if done.exported or done.replaced:
            store.write_json(INDEX, index)
    return done


def _write_trace(t: Any, tid: str, store: Store, old: dict[str, Any] | None) -> dict[str, Any]:
    m = t.manifest
    host = (m.get("host") or {}).get("hostname")
    date, model, driver = start_date(m), gpu_model(m), m.get("driver_version")
    files: dict[str, str] = {}
    rows: dict[str, int] = {}
    for name, table in schema.TABLES.items():
        if not t.parts(name):
            continue
        data = t.scan(name).collect().to_arrow().cast(table.arrow_schema)
        if data.num_rows == 0:
            continue
        n = data.num_rows
        for col, value in (("trace_id", tid), ("driver_version", driver), ("gpu_model", model)):
            data = data.append_column(pa.field(col, pa.string()), pa.array([value] * n,
                                                                            pa.string()))
        rel = f"{name}/{partition(date, host)}/{tid}.parquet"
        store.write_parquet(rel, data)
        files[name], rows[name] = rel, n
    record = {"trace_id": tid, "host": host, "date": date, "driver_version": driver,
              "gpu_model": model, "manifest": m, "problems": t.warnings(),
              "files": files, "rows": rows}
    rec_rel = f"traces/{tid}.json"
    store.write_json(rec_rel, record)
    for stale in set((old or {}).get("files", {}).values()) - set(files.values()):
        store.remove(stale)
    return {"trace_id": tid, "host": host, "date": date, "driver_version": driver,
            "gpu_model": model, "status": t.status, "drops": t.drops,
            "synthetic": bool(m.get("synthetic", False)), "start_ts_ns": m.get("start_ts_ns"),
            "fingerprint": fingerprint(m), "record": rec_rel, "files": files,
            "rows": sum(rows.values()), "source": str(t.path)}


def index_frame(index: dict[str, Any]) -> pl.DataFrame:
    """The index's traces as a frame of the trace-level `--where` fields."""
    rows = [{"trace_id": e["trace_id"], "host": e.get("host"), "date": e.get("date"),
             "driver_version": e.get("driver_version"), "gpu_model": e.get("gpu_model"),
             "status": e.get("status")} for e in index["traces"].values()]
    return pl.DataFrame(rows, schema=dict.fromkeys(
        ("trace_id", "host", "date", "driver_version", "gpu_model", "status"), pl.String))
