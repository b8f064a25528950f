"""Every snapshot format PyTorch has written (fixtures/torch-*, made by
fixtures/make_torch_snapshots.py), imported and reported right. Each test's truth is
counted here by a second, tiny reader over the raw pickle (plain `pickle` with every
global refused, a dozen lines of sums and a backwards replay), never by the importer
or the analyses; what a format lacks must come out null, not zero."""

from __future__ import annotations

import gzip
import io
import lzma
import pickle
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from gputrace.importers.torch_snapshot import read_snapshot, write_alone
from gputrace.trace.reader import open_trace
from tests.analyze_helpers import analyze
from tests.conftest import ROOT

MiB = 1 << 20
FIX = ROOT / "fixtures"
FILES = {
    "torch-2.0": FIX / "torch-2.0" / "snapshot.pickle",
    "torch-2.1": FIX / "torch-2.1" / "snapshot.pickle",
    "torch-current": FIX / "torch-current" / "snapshot.pickle.gz",
    "torch-segments-list": FIX / "torch-segments-list" / "snapshot.pickle",
    "torch-oom-observer": FIX / "torch-oom-observer" / "oom_snapshot.pickle",
    "torch-expandable": FIX / "torch-expandable" / "snapshot.pickle.gz",
    # real snapshots recorded by others (MIT; fixtures/README.md)
    "torch-real-cs336-magma27": FIX / "torch-real-cs336-magma27" / "memory_snapshot.pickle.xz",
    "torch-real-cs336-bcrafton": FIX / "torch-real-cs336-bcrafton" / "memory_snapshot.pickle.xz",
}


# ------------------------------------------------------------------ the second reader


class _Plain(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise ValueError(f"global {module}.{name}")


def raw(path: Path) -> Any:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    elif data[:6] == b"\xfd7zXZ\x00":
        data = lzma.decompress(data)
    return _Plain(io.BytesIO(data)).load()


def _req(b: dict[str, Any]) -> int:
    if b.get("requested_size") is not None:
        return int(b["requested_size"])
    hist = b.get("history") or [{}]
    return int(hist[0].get("real_size") or b["size"])


def truth(path: Path) -> dict[str, Any]:
    """Per device and per pool sums of the raw snapshot, and each device's history
    replayed backwards from its segments (reserved and requested bytes)."""
    v = raw(path)
    segs = v if isinstance(v, list) else v["segments"]
    traces = [] if isinstance(v, list) else v.get("device_traces", [])
    dev: dict[int, dict[str, int]] = {}
    pools: dict[tuple[int, str | None, str], dict[str, int]] = {}
    for s in segs:
        pid = s.get("segment_pool_id")
        key = (s["device"], None if pid is None else f"{pid[0]},{pid[1]}", s["segment_type"])
        alloc = sum(b["size"] for b in s["blocks"] if b["state"] == "active_allocated")
        live_req = sum(_req(b) for b in s["blocks"] if b["state"] != "inactive")
        for d in (dev.setdefault(s["device"], {"reserved": 0, "allocated": 0, "req": 0,
                                               "segments": 0}),
                  pools.setdefault(key, {"reserved": 0, "allocated": 0, "req": 0,
                                         "segments": 0})):
            d["reserved"] += s["total_size"]
            d["allocated"] += alloc
            d["req"] += live_req
            d["segments"] += 1
    series: dict[int, dict[str, Any]] = {}
    for d, entries in enumerate(traces):
        if not entries:
            continue
        r = dev.get(d, {}).get("reserved", 0)
        q = dev.get(d, {}).get("req", 0)
        peak_r, peak_q, after = r, q, []
        for e in reversed(entries):  # undo each entry, newest first
            after.append((e["action"], r, q))
            sign = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1,
                    "segment_unmap": -1}.get(e["action"], 0)
            r -= sign * e["size"]
            q -= {"alloc": 1, "free_completed": -1}.get(e["action"], 0) * e["size"]
            peak_r, peak_q = max(peak_r, r), max(peak_q, q)
        after.reverse()
        series[d] = {"start_reserved": r, "start_requested": q, "peak_reserved": peak_r,
                     "peak_requested": peak_q, "entries": len(entries),
                     "oom": [(rr, qq) for a, rr, qq in after if a == "oom"]}
    blocks = sum(len(s["blocks"]) for s in segs)
    return {"devices": dev, "pools": pools, "series": series, "blocks": blocks,
            "segments": len(segs), "entries": sum(len(t) for t in traces)}


@pytest.fixture(scope="module", params=sorted(FILES))
def imported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
             ) -> tuple[str, Path, dict[str, Any], dict[str, Any]]:
    name = request.param
    out = write_alone(read_snapshot(FILES[name]), tmp_path_factory.mktemp(name) / "t")
    return name, out, truth(FILES[name]), analyze(out)


# ------------------------------------------------------------------ every variant


def test_tables_hold_every_row(imported: tuple[str, Path, dict[str, Any], Any]) -> None:
    _, out, t, _ = imported
    tr = open_trace(out)
    assert tr.scan("allocator_segments").collect().height == t["segments"]
    assert tr.scan("allocator_blocks").collect().height == t["blocks"]
    assert tr.scan("allocator_events").collect().height == t["entries"]


def test_pool_report_per_device_and_pool(imported: tuple[str, Path, dict[str, Any],
                                                        dict[str, Any]]) -> None:
    name, _, t, doc = imported
    p = doc["allocator_pool"]
    got = {d["device"]: (d["reserved_bytes"], d["allocated_bytes"], d["segments"])
           for d in p["devices"]}
    assert got == {k: (v["reserved"], v["allocated"], v["segments"])
                   for k, v in t["devices"].items()}, name
    pools = {(x["device"], x["pool_id"], x["pool"]): (x["reserved_bytes"], x["allocated_bytes"])
             for x in p["pools"]}
    assert pools == {k: (v["reserved"], v["allocated"]) for k, v in t["pools"].items()}, name
    head = max(t["devices"].items(), key=lambda kv: kv[1]["reserved"])
    assert (p["device"], p["reserved_bytes"]) == (head[0], head[1]["reserved"])


def test_growth_per_device(imported: tuple[str, Path, dict[str, Any], dict[str, Any]]) -> None:
    name, _, t, doc = imported
    g = doc["allocator_growth"]
    got = {d["device"]: d for d in g["devices"]}
    assert set(got) == set(t["series"]), name
    for dev, s in t["series"].items():
        d = got[dev]
        assert (d["start_reserved_bytes"], d["peak_reserved_bytes"]) == (
            s["start_reserved"], s["peak_reserved"]), (name, dev)
        assert (d["start_requested_bytes"], d["peak_requested_bytes"]) == (
            s["start_requested"], s["peak_requested"]), (name, dev)
        assert d["entries"] == s["entries"]
        # rounded blocks hold at least what was requested, the cache at least the blocks
        assert d["start_requested_bytes"] <= d["start_active_bytes"] <= d["start_reserved_bytes"]
    if t["series"]:  # the headline is one device's, never a sum
        assert g["peak_reserved_bytes"] == max(s["peak_reserved"] for s in t["series"].values())


def test_oom_entries_in_allocator_terms(imported: tuple[str, Path, dict[str, Any],
                                                       dict[str, Any]]) -> None:
    name, _, t, doc = imported
    states = [i["allocator_state"] for i in doc["oom"]["incidents"]]
    want = [(d, r, q) for d, s in sorted(t["series"].items()) for r, q in s["oom"]]
    assert [(s["device"], s["reserved_bytes"], s["requested_active_bytes"])
            for s in states] == want, name


# ------------------------------------------------------------------ what each one lacks


def _tables(name: str, tmp_path: Path) -> dict[str, pl.DataFrame]:
    out = write_alone(read_snapshot(FILES[name]), tmp_path / "t")
    tr = open_trace(out)
    return {n: tr.scan(n).collect() for n in ("allocator_segments", "allocator_blocks",
                                               "allocator_events", "allocator_frames")}


def test_pytorch_2_0_addresses_derived_and_lacks_null(tmp_path: Path) -> None:
    t = _tables("torch-2.0", tmp_path)
    base = raw(FILES["torch-2.0"])["segments"][0]["address"]
    assert "address" not in raw(FILES["torch-2.0"])["segments"][0]["blocks"][0]
    b = t["allocator_blocks"]
    assert b["address"].to_list() == [base, base + 8 * MiB]
    # frames and the request from the block's history; the free block has neither
    assert b["requested_size_bytes"].to_list() == [8 * MiB - 100, None]
    assert b["stack_id"][0] is not None and b["stack_id"][1] is None
    s = t["allocator_segments"]
    assert s["requested_size_bytes"].to_list() == [None] and s["pool_id"].to_list() == [None]
    assert s["is_expandable"].to_list() == [None]
    ev = t["allocator_events"]
    assert ev["time_us"].null_count() == ev.height == 7 and ev["ts_ns"].null_count() == 7
    assert ev["seq"].to_list() == list(range(7))
    m = open_trace(tmp_path / "t").manifest["imported"][0]
    assert any("without time_us" in n for n in m["notes"])
    assert any("derived from the segment's address" in n for n in m["notes"])


def test_pytorch_2_1_times_null_said_once(tmp_path: Path) -> None:
    t = _tables("torch-2.1", tmp_path)
    assert t["allocator_events"]["time_us"].null_count() == 7
    notes = open_trace(tmp_path / "t").manifest["imported"][0]["notes"]
    assert sum("without time_us" in n for n in notes) == 1


def test_current_keeps_settings_streams_pools_and_paths(tmp_path: Path) -> None:
    t = _tables("torch-current", tmp_path)
    m = open_trace(tmp_path / "t").manifest["imported"][0]
    assert m["allocator_settings"]["max_split_size"] == -1
    assert m["allocator_settings"]["expandable_segments"] is False
    assert m["external_annotations"] == 1
    s = t["allocator_segments"]
    assert sorted(set(s["pool_id"])) == ["0,0", "0,1", "1,3"]
    assert 0x55AA in set(s["stream"])
    ev = t["allocator_events"]
    assert "step=7" in set(ev["user_metadata"]) and "[0/1] forward" in set(ev["compile_context"])
    assert "C:\\Users\\u\\proj\\model.py" in set(t["allocator_frames"]["filename"])


def test_graph_and_private_pools_are_never_folded(tmp_path: Path) -> None:
    out = write_alone(read_snapshot(FILES["torch-current"]), tmp_path / "t")
    pools = {(p["device"], p["pool_id"]): p for p in analyze(out)["allocator_pool"]["pools"]
             if p["device"] == 2}
    assert pools[(2, "1,3")]["reserved_bytes"] == 32 * MiB
    assert pools[(2, "1,3")]["allocated_bytes"] == 24 * MiB
    assert pools[(2, "0,1")]["active_bytes"] == 6 * MiB  # pending free on a graph's stream
    assert pools[(2, "0,0")]["reserved_bytes"] == 2 * MiB


def test_segment_rows_count_their_blocks(tmp_path: Path) -> None:
    """allocated_bytes comes from the blocks: the segment header may say otherwise."""
    v = raw(FILES["torch-current"])
    for s in v["segments"]:
        s["allocated_size"] = 0  # what the broken rows showed
    f = tmp_path / "s.pickle"
    f.write_bytes(pickle.dumps(v))
    out = write_alone(read_snapshot(f), tmp_path / "t")
    segs = {s["address"]: s for s in analyze(out)["allocator_pool"]["segments"]}
    for s in v["segments"]:
        want = sum(b["size"] for b in s["blocks"] if b["state"] == "active_allocated")
        assert segs[s["address"]]["allocated_bytes"] == want
        assert segs[s["address"]]["reserved_unallocated_bytes"] == s["total_size"] - want


def test_expandable_oom_state(tmp_path: Path) -> None:
    """The 48 MiB failure on device 0: 32 MiB mapped (32 unmapped just before), a 20 MiB
    block live, 12 MiB free in one piece; by hand from the fixture's entries."""
    out = write_alone(read_snapshot(FILES["torch-expandable"]), tmp_path / "t")
    doc = analyze(out)
    (inc,) = doc["oom"]["incidents"]
    s = inc["allocator_state"]
    assert (s["device"], s["requested_bytes"], s["device_free_bytes"]) == (0, 48 * MiB, 6 * MiB)
    assert (s["reserved_bytes"], s["active_bytes"], s["cache_free_bytes"]) == (
        32 * MiB, 20 * MiB, 12 * MiB)
    assert s["largest_free_block_bytes"] == 12 * MiB
    assert s["released_before"] == {"segment_frees": 0, "segment_unmaps": 1, "bytes": 32 * MiB}
    assert s["verdict"] == "capacity" and inc["allocator_pool_bytes"] == 12 * MiB
    g = {d["device"]: d for d in doc["allocator_growth"]["devices"]}
    assert (g[0]["segment_maps"], g[0]["segment_unmaps"]) == (3, 1)
    assert g[0]["start_active_bytes"] == 0 and g[1]["start_active_bytes"] == 0
    # no figure adds devices: 64 MiB each on 0 and 1, never 128
    assert doc["allocator_growth"]["peak_reserved_bytes"] == 64 * MiB


def test_current_oom_after_segment_free(tmp_path: Path) -> None:
    out = write_alone(read_snapshot(FILES["torch-current"]), tmp_path / "t")
    (inc,) = analyze(out)["oom"]["incidents"]
    s = inc["allocator_state"]
    assert (s["device"], s["reserved_bytes"], s["active_bytes"]) == (1, 40 * MiB, 30 * MiB)
    assert (s["cache_free_bytes"], s["largest_free_block_bytes"]) == (10 * MiB, 10 * MiB)
    assert s["released_before"] == {"segment_frees": 1, "segment_unmaps": 0, "bytes": 20 * MiB}
    assert "20.0 MiB" in s["evidence"] and s["verdict"] == "capacity"


def test_history_less_dumps_are_the_end_state(tmp_path: Path) -> None:
    for name in ("torch-oom-observer", "torch-segments-list"):
        out = write_alone(read_snapshot(FILES[name]), tmp_path / name)
        doc = analyze(out)
        assert doc["allocator_growth"]["entries"] == 0
        assert doc["allocator_growth"]["start_active_bytes"] is None  # unknown, not 0
        notes = open_trace(out).manifest["imported"][0]["notes"]
        assert any("no trace entries" in n for n in notes), notes


def test_oom_without_times(tmp_path: Path) -> None:
    """PyTorch 2.1 entries have no time: the OOM is still found, in allocator terms,
    and the reports that need a time say nothing rather than fail."""
    v = raw(FILES["torch-current"])
    for trace in v["device_traces"]:
        for e in trace:
            e.pop("time_us", None)
    f = tmp_path / "s.pickle"
    f.write_bytes(pickle.dumps(v))
    out = write_alone(read_snapshot(f), tmp_path / "t")
    doc = analyze(out)
    (inc,) = doc["oom"]["incidents"]
    assert inc["t_s"] is None and inc["holders"] == []
    s = inc["allocator_state"]
    assert (s["device"], s["reserved_bytes"], s["cache_free_bytes"]) == (1, 40 * MiB, 10 * MiB)
    assert all(p["t_s"] is None for p in doc["allocator_growth"]["series"])


def test_info_says_what_the_format_lacks_once(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from gputrace import cli

    assert cli.main(["import", "torch-snapshot", str(FILES["torch-2.0"]), "-o",
                     str(tmp_path / "t")]) == 0
    assert capsys.readouterr().out.count("without time_us") == 1
    assert cli.main(["info", str(tmp_path / "t")]) == 0
    out = capsys.readouterr().out
    assert out.count("without time_us") == 1 and "note     blocks without addresses" in out


def test_synthetic_fixtures_match_their_script() -> None:
    """fixtures/torch-* are what fixtures/make_torch_snapshots.py writes, byte for byte."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_torch", FIX / "make_torch_snapshots.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    made = mod.variants()
    assert set(made) == {k for k in FILES if "real" not in k}
    for folder, (name, value) in made.items():
        data = pickle.dumps(value, protocol=4)
        if name.endswith(".gz"):
            data = gzip.compress(data, mtime=0)
        assert (FIX / folder / name).read_bytes() == data, folder
