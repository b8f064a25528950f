"""`gputrace export`: many trace directories written as one partitioned dataset.

Layout (docs/fleet.md)::

    DEST/manifest.json                                  the dataset index
    DEST/traces/<trace_id>.json                         one record per trace
    DEST/<table>/date=YYYY-MM-DD/host=NAME/<trace_id>.parquet

A trace's files are named by its id, so writing it again overwrites, never
duplicates. The index is written last: a trace is in the dataset once the
index lists it, and an export stopped midway leaves the dataset as it was
plus files the next export overwrites.

The index is untrusted input like a trace: `read_index` refuses one whose paths
are not the ones an export writes, a trace id is never taken over by another
recording, and a dataset of a newer schema is refused rather than misread.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeGuard
from urllib.parse import quote

import polars as pl
import pyarrow as pa

from gputrace import schema
from gputrace.fleet.store import DatasetError, Store, key_problem
from gputrace.trace.manifest import TRACE_ID_PATTERN

DATASET_FORMAT = "gputrace-fleet"
DATASET_VERSION = 1
INDEX = "manifest.json"
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
_ID_RE = re.compile(TRACE_ID_PATTERN)
_TABLE_RE = re.compile(r"[a-z][a-z0-9_]*")


def recording_key(m: dict[str, Any]) -> list[Any]:
    """What a recording never changes while it runs (hostname, start, creation time,
    recorder pid, clock offset): two manifests with the same key are one recording seen
    at two moments, e.g. while `recording` and once `complete`."""
    return [(m.get("host") or {}).get("hostname"), m.get("start_ts_ns"),
            m.get("created_unix_s"), (m.get("recorder") or {}).get("pid"),
            (m.get("clock") or {}).get("realtime_offset_ns")]


def trace_id(m: dict[str, Any]) -> str:
    """Which recording is this? The manifest's own `trace_id` when it has one, else a
    hash of what a recording never changes while it runs (host, start, creation time,
    recorder pid), so a trace exported while `recording` and again once `complete`
    keeps its identity."""
    own = m.get("trace_id")
    if isinstance(own, str) and _ID_RE.fullmatch(own):
        return own
    return "t" + hashlib.sha256(json.dumps(recording_key(m)).encode()).hexdigest()[:24]


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


def record_path(tid: str) -> str:
    return f"traces/{tid}.json"


def files_problem(tid: str, files: object) -> str | None:
    """What is wrong with a trace's `files` (table name -> key), or None: each key must be
    the one export writes for that table of that trace (`<table>/date=D/host=H/<tid>.parquet`,
    a key `key_problem` accepts), so an index can name no file outside the dataset and
    no other trace's file, for reading or for deleting."""
    if not isinstance(files, dict):
        return "'files' is not an object"
    for name, rel in files.items():
        why = key_problem(rel)
        if why is None and not (
                isinstance(name, str) and _TABLE_RE.fullmatch(name) and re.fullmatch(
                    rf"{name}/date=[^/]+/host=[^/]+/{re.escape(tid)}\.parquet", str(rel))):
            why = f"not where export writes table {name!r} of this trace"
        if why is not None:
            return f"file {rel!r}: {why}"
    return None


def entry_problem(tid: object, entry: object) -> str | None:
    """What is wrong with the index entry `entry` listed under `tid`, or None: the id is
    a trace id, the entry says the same, and its record and files are the paths export
    writes for that id."""
    if not isinstance(tid, str) or not _ID_RE.fullmatch(tid):
        return "not a trace id"
    if not isinstance(entry, dict):
        return "not an object"
    if entry.get("trace_id") != tid:
        return f"its trace_id is {entry.get('trace_id')!r}"
    if entry.get("record") != record_path(tid):
        return f"record {entry.get('record')!r} is not {record_path(tid)!r}"
    return files_problem(tid, entry.get("files"))


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
    if not _is_int(index.get("format_version")) or index["format_version"] > DATASET_VERSION:
        raise DatasetError(f"{store.url}: dataset format {index.get('format_version')!r} is "
                           f"not one this gputrace reads ({DATASET_VERSION})")
    sv = index.get("schema_version")
    if not _is_int(sv):
        raise DatasetError(f"{store.url}/{INDEX}: schema_version {sv!r} is not an integer")
    if sv > schema.SCHEMA_VERSION:
        raise DatasetError(f"{store.url}: dataset written by a newer gputrace (schema version "
                           f"{sv} > supported {schema.SCHEMA_VERSION}); upgrade gputrace")
    if not isinstance(index.get("traces"), dict):
        raise DatasetError(f"{store.url}/{INDEX}: 'traces' is not an object")
    # every path a reader opens or an export deletes comes from here: all of them are
    # checked before anything is read or written
    for tid, entry in index["traces"].items():
        why = entry_problem(tid, entry)
        if why is not None:
            raise DatasetError(f"{store.url}/{INDEX}: trace {tid!r}: {why}")
    return index


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def export_traces(paths: Iterable[str], store: Store,
                  note: Callable[[str], None] = lambda _: None) -> ExportResult:
    """Add traces to the dataset at `store`; a trace already there unchanged is skipped."""
    from gputrace.trace.reader import open_trace

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
            if old is not None:
                _refuse_other_recording(store, tid, old, t.manifest, path)
            t.validate()
            index["traces"][tid] = _write_trace(t, tid, store, old)
            (done.replaced if old is not None else done.exported).append(tid)
            note(f"exported {path} as {tid}")
    finally:
        if done.exported or done.replaced:
            store.write_json(INDEX, index)
    return done


def _refuse_other_recording(store: Store, tid: str, old: dict[str, Any], m: dict[str, Any],
                            path: str) -> None:
    """A changed manifest under a known id replaces that trace only if it is the same
    recording (same `recording_key`, e.g. now `complete`); a copied or forged id would
    otherwise delete another trace's files and drop it from the fleet's totals."""
    rec = store.read_json(record_path(tid))
    old_m = rec.get("manifest") if isinstance(rec, dict) else None
    if not isinstance(old_m, dict):
        raise DatasetError(f"{store.url}/{record_path(tid)}: not a trace record")
    if recording_key(old_m) != recording_key(m):
        raise DatasetError(f"{path}: trace_id {tid} already names another recording in the "
                           f"dataset ({old.get('source')!r} on host {old.get('host')!r}); "
                           "refusing to replace it")


def _write_trace(t: Any, tid: str, store: Store, old: dict[str, Any] | None) -> dict[str, Any]:
    m = t.manifest
    old_files = set((old or {}).get("files", {}).values())
    for rel in old_files:
        store.path(rel)  # a stale file behind a link out of the dataset: refuse before writing
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
    rec_rel = record_path(tid)
    store.write_json(rec_rel, record)
    for stale in old_files - set(files.values()):
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
