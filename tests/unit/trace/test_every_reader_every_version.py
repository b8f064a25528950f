"""Every reader accepts every trace `analyze` accepts, whatever its schema version:
`export`, `fleet analyze`, `diff`, `convert` and `import torch-snapshot --into` run on
every committed fixture (schema 1 recordings among them: fixtures/standin-*,
real-h200-cuda), reading the nullable columns added since as nulls, as
`open_trace(...).scan` does. Also a dataset exported by an older gputrace (lacking
those columns) under `fleet analyze`."""

from __future__ import annotations

import gzip
import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gputrace import schema
from gputrace.trace.files import PENDING
from gputrace.trace.reader import open_trace
from tests.cli_helpers import cli
from tests.conftest import ROOT

FIXTURES = sorted(p.parent for p in (ROOT / "fixtures").glob("**/manifest.json"))
IDS = [str(p.relative_to(ROOT / "fixtures")) for p in FIXTURES]
OLDEST = min(FIXTURES, key=lambda p: (json.loads((p / "manifest.json").read_text())
                                      ["schema_version"], str(p)))
MiB = 1 << 20


def _version(trace: Path) -> int:
    return int(json.loads((trace / "manifest.json").read_text())["schema_version"])


def _missing_nullable(trace: Path, table: str) -> list[str]:
    """Columns of the current schema that `table`'s first part of `trace` lacks."""
    part = sorted((trace / table).glob("part-*.parquet"))[0]
    have = set(pq.read_schema(part).names)
    return [c.name for c in schema.table(table).columns if c.name not in have]


def test_fixtures_of_every_version_are_here() -> None:
    """What the tests below cover: fixtures of the first schema version and newer,
    the oldest lacking columns of the current schema."""
    versions = {_version(p) for p in FIXTURES}
    assert min(versions) == 1 and max(versions) > 1 and len(FIXTURES) >= 15
    assert _missing_nullable(OLDEST, "processes")


@pytest.mark.parametrize("trace", FIXTURES, ids=IDS)
def test_diff_reads_every_fixture(trace: Path) -> None:
    r = cli("diff", str(trace), str(OLDEST), "-f", "json")
    assert r.returncode == 0, r.stderr
    json.loads(r.stdout)


def test_export_and_fleet_read_every_fixture(tmp_path: Path) -> None:
    ds = tmp_path / "ds"
    r = cli("export", *map(str, FIXTURES), "--to", str(ds))
    assert r.returncode == 0, r.stderr
    index = json.loads((ds / "manifest.json").read_text())
    by_source = {e["source"]: e for e in index["traces"].values()}
    for trace in FIXTURES:
        t = open_trace(trace)
        rows = sum(t.scan(n).select(pl.len()).collect().item() for n in schema.TABLES)
        assert by_source[str(trace)]["rows"] == rows, trace
    # a dataset written by an older gputrace: its files lack the nullable columns
    # added since (as the oldest fixture's parts do)
    old_cols = _missing_nullable(OLDEST, "processes")
    for rel in by_source[str(OLDEST)]["files"].values():
        if rel.startswith("processes/"):
            f = ds / rel
            pq.write_table(pq.read_table(f).drop_columns(old_cols), f)
    r = cli("fleet", "analyze", str(ds), "--workers", "1", "-f", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["traces"] == len(FIXTURES)


@pytest.mark.parametrize("trace", FIXTURES, ids=IDS)
def test_convert_folds_pending_rows_of_the_trace_version(trace: Path, tmp_path: Path) -> None:
    """A recorder of the trace's own version killed mid-run left processes/PENDING
    rows in that version's columns: `convert` makes them a part, the columns
    added since as nulls."""
    copy = tmp_path / "t"
    shutil.copytree(trace, copy)
    parts = sorted((copy / "processes").glob("part-*.parquet"))
    if not parts:
        pytest.skip("no processes table")
    rows = pq.read_table(parts[0])
    pending = rows.slice(0, 1)
    field = pending.schema.get_field_index("pid")
    pending = pending.set_column(field, "pid",
                                 pa.array([4_000_000], pending.schema.field(field).type))
    pq.write_table(pending, copy / "processes" / PENDING)
    r = cli("convert", str(copy))
    assert r.returncode == 0, r.stderr
    procs = open_trace(copy).scan("processes").collect()
    got = procs.filter(pl.col("pid") == 4_000_000)
    assert got.height == 1
    added = {c.name for c in schema.table("processes").columns} - set(rows.schema.names)
    if _version(trace) == 1:
        assert added  # the case of this test: columns the part's version lacks
    for col in added:
        assert got[col][0] is None, col


def _snapshot(tmp_path: Path, address: int, time_us: int) -> Path:
    """A synthetic snapshot (plain dicts): one 2 MiB segment at `address`, allocated
    and holding a 1 MiB tensor from train() at `time_us`."""
    frames = [{"name": "train", "filename": "t.py", "line": 10}]
    snap = {
        "segments": [{
            "device": 0, "address": address, "total_size": 2 * MiB, "allocated_size": MiB,
            "active_size": MiB, "requested_size": MiB, "stream": 0, "segment_type": "large",
            "segment_pool_id": (0, 0), "is_expandable": False, "frames": frames,
            "blocks": [{"address": address, "size": MiB, "requested_size": MiB,
                        "state": "active_allocated", "frames": frames},
                       {"address": address + MiB, "size": MiB, "requested_size": 0,
                        "state": "inactive", "frames": []}]}],
        "device_traces": [[
            {"action": "segment_alloc", "addr": address, "size": 2 * MiB, "stream": 0,
             "time_us": time_us, "frames": frames},
            {"action": "alloc", "addr": address, "size": MiB, "stream": 0,
             "time_us": time_us, "frames": frames}]],
        "allocator_settings": {}, "external_annotations": [],
    }
    f = tmp_path / "snap.pickle.gz"
    with gzip.open(f, "wb") as g:
        pickle.dump(snap, g)
    return f


def _first_alloc(t: Any) -> tuple[int, int, int] | None:
    """(ptr, pid, ts_ns) of the trace's first successful cuMemAlloc_v2, or None."""
    calls = (t.scan("cuda_calls").filter((pl.col("func") == "cuMemAlloc_v2")
                                         & (pl.col("result") == 0) & (pl.col("ptr") > 0))
             .sort("ts_ns").select("ptr", "pid", "ts_ns").collect())
    return None if calls.is_empty() else tuple(calls.row(0))  # type: ignore[return-value]


@pytest.mark.parametrize("trace", FIXTURES, ids=IDS)
def test_import_into_reads_every_fixture(trace: Path, tmp_path: Path) -> None:
    """`import torch-snapshot --into` joins a snapshot whose segment one of the
    fixture's cuMemAlloc calls returned, on a fixture of any version (the oldest
    recordings included); a fixture without API calls is refused for that reason
    only, never for its columns."""
    t = open_trace(trace)
    hit = _first_alloc(t)
    out = tmp_path / "joined"
    if hit is None:
        r = cli("import", "torch-snapshot", str(_snapshot(tmp_path, 0x7F00_0000_0000, 0)),
                "--into", str(trace), "-o", str(out))
        assert r.returncode != 0 and "columns" not in r.stderr
        assert "no API layer" in r.stderr or "none of the snapshot's" in r.stderr, r.stderr
        return
    ptr, pid, ts = hit
    offset = t.manifest["clock"]["realtime_offset_ns"]
    snap = _snapshot(tmp_path, ptr, (ts + offset) // 1000 + 1)
    r = cli("import", "torch-snapshot", str(snap), "--into", str(trace), "-o", str(out))
    assert r.returncode == 0, r.stderr
    j = open_trace(out)
    assert j.layers[-1] == "allocator"
    segs = j.scan("allocator_segments").collect()
    # the latest allocation of that address by that process (addresses are reused)
    latest = (t.scan("cuda_calls").filter((pl.col("ptr") == ptr) & (pl.col("pid") == pid)
                                          & (pl.col("result") == 0)
                                          & pl.col("func").str.starts_with("cuMemAlloc"))
              .select(pl.col("ts_ns").max()).collect().item())
    assert segs["address"].to_list() == [ptr] and segs["api_alloc_ts_ns"].to_list() == [latest]
    assert latest >= ts
    assert set(j.scan("allocator_events").collect()["pid"]) == {pid}
    # the recording's rows are all there, old columns as nulls
    for name in ("cuda_calls", "processes"):
        assert j.scan(name).collect().equals(t.scan(name).collect()), name
