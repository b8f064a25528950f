"""The flight recorder's window arithmetic and writer (`record --keep`,
`--freeze-on`), without probes: planted parts of known times and sizes."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from gputrace import schema
from gputrace.errors import UsageError
from gputrace.trace.flight import INCIDENTS, FlightWriter
from gputrace.trace.reader import open_trace
from gputrace.trace.window import Keep, Part, expired, parse_keep

S = 10**9


@pytest.mark.parametrize(("texts", "ns", "size"), [
    (["15m"], 900 * S, None),
    (["1h"], 3600 * S, None),
    (["30s"], 30 * S, None),
    (["2GiB"], None, 2 << 30),
    (["2G"], None, 2 << 30),
    (["500MB"], None, 500 * 10**6),
    (["15m", "2GiB"], 900 * S, 2 << 30),
])  # fmt: skip
def test_parse_keep(texts: list[str], ns: int | None, size: int | None) -> None:
    k = parse_keep(texts)
    assert (k.ns, k.bytes) == (ns, size)


@pytest.mark.parametrize("texts", [["15"], ["1s"], ["100KiB"], ["15m", "1h"], ["x"], ["-5m"],
                                   ["1GiB", "2GiB"]])  # fmt: skip
def test_parse_keep_refused(texts: list[str]) -> None:
    with pytest.raises(UsageError):
        parse_keep(texts)


def _parts() -> list[Part]:
    # one 100-byte part a second for 10 s, plus a stacks part and a running process's row
    parts = [Part("ioctls", f"p{i}", 10, 100, i * S, i * S + S // 2) for i in range(10)]
    return [*parts, Part("stacks", "s", 5, 1000, None, None),
            Part("processes", "r", 1, 50, None, None)]


def test_expired_by_time() -> None:
    # newest row 9.5 s: a 3 s window keeps rows from 6.5 s; parts ending before go
    gone = expired(_parts(), Keep(ns=3 * S))
    assert [p.name for p in gone] == ["p0", "p1", "p2", "p3", "p4", "p5"]


def test_expired_by_size() -> None:
    # 1000 deletable bytes held; 350 kept: the newest three parts (stacks never count)
    gone = expired(_parts(), Keep(bytes=350))
    assert [p.name for p in gone] == [f"p{i}" for i in range(7)]


def test_expired_both_keeps_the_smaller() -> None:
    gone = expired(_parts(), Keep(ns=8 * S, bytes=250))
    assert [p.name for p in gone] == [f"p{i}" for i in range(8)]


def _sample(ts: int) -> pa.Table:
    t = schema.table("gpu_memory")
    return pa.Table.from_pylist([{"ts_ns": ts, "gpu_index": 0, "heap_size_bytes": 1 << 30,
                                  "heap_free_bytes": 1 << 29, "largest_free_bytes": 1 << 28,
                                  "largest_free_base_bytes": 0, "status": 0}],
                                schema=t.arrow_schema)  # fmt: skip


def test_flight_writer_deletes_and_freezes(tmp_path: Path) -> None:
    out = tmp_path / "flight"
    w = FlightWriter(out, keep=Keep(ns=3 * S, text="3s"), grace_ns=0, rotate_s=1.0,
                     manifest={"trace_id": "flight-1"})  # fmt: skip
    for i in range(10):  # one part a second, rows at 0..9 s
        w.append("gpu_memory", _sample(i * S))
        w.rotate()
    # newest 9 s: rows before 6 s are out of the window, their parts deleted
    names = sorted(p.name for p in (out / "gpu_memory").iterdir())
    assert names == ["part-000007.parquet", "part-000008.parquet", "part-000009.parquet",
                     "part-000010.parquet"]  # fmt: skip
    m = json.loads((out / "manifest.json").read_text())
    assert m["tables"]["gpu_memory"] == {"rows": 4, "parts": 4, "last_part": 10}
    win = m["window"]
    assert (win["keep_ns"], win["from_ts_ns"], win["deleted_parts"], win["deleted_rows"]) == (
        3 * S, 5 * S + 1, 6, 6)
    assert win["held_bytes"] == sum(p.stat().st_size for p in (out / "gpu_memory").iterdir())
    # an incident at 9 s keeps what is held now and the next part (its end is past)
    rel = w.freeze("oom", 9 * S, 0, {"verdict": "capacity"})
    assert rel is not None and rel.startswith(f"{INCIDENTS}/") and rel.endswith("-oom")
    assert w.freeze("oom", 9 * S, 0) is None  # within the open one: counted there
    w.append("gpu_memory", _sample(10 * S))
    w.close()
    inc = open_trace(out / rel)
    assert inc.manifest["status"] == "complete"
    assert inc.manifest["window"]["trigger"] == "oom"
    assert inc.manifest["window"]["events"] == 2
    assert inc.manifest["window"]["from_ts_ns"] == 6 * S
    assert inc.manifest["window"]["detail"] == {"verdict": "capacity"}
    # a trace of its own (export files it apart), naming the recording it came from
    assert inc.manifest["window"]["flight_trace_id"] == "flight-1"
    assert inc.manifest["trace_id"] not in (None, "flight-1")
    ts = inc.scan("gpu_memory").collect()["ts_ns"].to_list()
    assert ts == [6 * S, 7 * S, 8 * S, 9 * S, 10 * S]
    assert not [x for x in inc.warnings() if "manifest announces" in x]
    assert any("incident window" in x for x in inc.warnings())
    # the flight trace says what it deleted and lists the incident
    flight = open_trace(out)
    m = flight.manifest
    assert m["incidents"] == [{"dir": rel, "trigger": "oom", "ts_ns": 9 * S, "status": "kept"}]
    assert flight.scan("gpu_memory").collect()["ts_ns"].to_list() == [7 * S, 8 * S, 9 * S,
                                                                       10 * S]  # fmt: skip
    assert any("keeps a window" in x for x in flight.warnings())
    assert not [x for x in flight.warnings() if "manifest announces" in x]
    # the incident's parts are links: the flight trace deleting them deletes nothing there
    assert not (out / "gpu_memory" / "part-000007.parquet").exists()
    assert (out / rel / "gpu_memory" / "part-000007.parquet").stat().st_nlink == 1
    assert (out / rel / "gpu_memory" / "part-000008.parquet").stat().st_nlink == 2
    # a restart with --force replaces the flight trace (parts numbered past those it
    # holds included) and keeps its incidents
    again = FlightWriter(out, keep=Keep(ns=3 * S, text="3s"), grace_ns=0, rotate_s=1.0,
                         force=True)  # fmt: skip
    again.close()
    assert not list((out / "gpu_memory").glob("part-*"))
    assert open_trace(out / rel).scan("gpu_memory").collect().height == 5


def test_freezer_oom_incident_with_verdict(tmp_path: Path) -> None:
    """A cuMemAlloc_v2 refused with CUDA_ERROR_OUT_OF_MEMORY freezes one incident whose
    details carry the verdict of the latest GPU memory sample."""
    from gputrace.record.freeze import Flight, Freezer
    from gputrace.trace.builder import TraceBuilder

    b = TraceBuilder()  # synthetic
    b.gpu_memory(0.1, 0, heap=80 << 30, free=8 << 30, largest=2 << 30)
    b.cuda_alloc(0.2, 7, 1 << 40, result=2)
    b.cuda_alloc(0.3, 7, 4096)  # succeeded: no incident
    w = FlightWriter(tmp_path / "t", keep=None, grace_ns=0, rotate_s=1.0)
    f = Freezer(Flight(None, frozenset({"oom"}), 5 * S), lambda: w)
    for name in ("gpu_memory", "cuda_calls"):
        rows = pa.Table.from_pylist(b.rows[name], schema=schema.table(name).arrow_schema)
        w.append(name, rows)
        f.observe(name, rows)
    w.close()
    m = json.loads((tmp_path / "t" / "manifest.json").read_text())
    assert [i["trigger"] for i in m["incidents"]] == ["oom"]
    assert "window" not in m  # no --keep: nothing deleted, no window
    inc = open_trace(tmp_path / "t" / m["incidents"][0]["dir"])
    d = inc.manifest["window"]["detail"]
    assert (d["verdict"], d["requested_bytes"], d["free_bytes"], d["largest_free_bytes"],
            d["gpu_index"], d["pid"], d["call"]) == (
        "capacity", 1 << 40, 8 << 30, 2 << 30, 0, 7, "cuMemAlloc_v2")  # fmt: skip
    assert inc.scan("cuda_calls").collect().height == 2


def test_an_oom_incident_says_the_failing_process_s_pod(tmp_path: Path) -> None:
    """Given the recorder's identity of each process, the incident's detail says which
    container and pod failed to allocate (docs/containers.md)."""
    from dataclasses import asdict

    from gputrace.identity import Identity
    from gputrace.record.freeze import Flight, Freezer
    from gputrace.trace.builder import TraceBuilder

    b = TraceBuilder()  # synthetic
    b.cuda_alloc(0.2, 7, 1 << 40, result=2)
    who = Identity("ab" * 32, "containerd", "6b1e4c1a-0d0f-4a55-9a5c-3f2b1d0e9c11",
                   "burstable", "ml", "trainer-0", "cuda")
    w = FlightWriter(tmp_path / "t", keep=None, grace_ns=0, rotate_s=1.0)
    f = Freezer(Flight(None, frozenset({"oom"}), 5 * S), lambda: w,
                lambda pid: who if pid == 7 else None)
    rows = pa.Table.from_pylist(b.rows["cuda_calls"], schema=schema.CUDA_CALLS.arrow_schema)
    w.append("cuda_calls", rows)
    f.observe("cuda_calls", rows)
    w.close()
    m = json.loads((tmp_path / "t" / "manifest.json").read_text())
    d = open_trace(tmp_path / "t" / m["incidents"][0]["dir"]).manifest["window"]["detail"]
    assert d["pid"] == 7 and {k: d[k] for k in asdict(who)} == asdict(who)


@pytest.mark.parametrize(("args", "says"), [
    (["--keep", "15"], "give a unit"),
    (["--keep", "2s"], "--keep must be from 5 s"),
    (["--freeze-on", "oops"], "is not a trigger"),
    (["--after", "10s"], "--after needs --freeze-on"),
    (["--freeze-on", "oom"], "--freeze-on needs --keep"),
    (["--keep", "1m", "--freeze-on", "oom", "--raw"], "not with --raw"),
    (["--keep", "1m", "--freeze-on", "alert"], "needs at least one --alert"),
    (["--keep", "1m", "--freeze-on", "oom", "--after", "0.5s"], "--after must be from 1 s"),
])  # fmt: skip
def test_record_refuses_bad_flight_options(tmp_path: Path, args: list[str], says: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from gputrace.cli import main

    assert main(["record", "-o", str(tmp_path / "t"), *args, "--", "true"]) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "t").exists()


def test_freeze_on_alert(tmp_path: Path) -> None:
    """`--freeze-on alert`: an --alert firing (GPU 0's free memory under 1 GiB) freezes
    one incident, its details the alert's."""
    from gputrace.live import LiveOptions, run
    from gputrace.record.freeze import Flight, Freezer
    from gputrace.trace.builder import TraceBuilder

    b = TraceBuilder()  # synthetic
    b.gpu_memory(0.1, 0, heap=80 << 30, free=512 << 20, largest=256 << 20)

    class Rec:
        def __init__(self) -> None:
            self.writer = FlightWriter(tmp_path / "t", keep=None, grace_ns=0, rotate_s=1.0)
            self.freezer = Freezer(Flight(None, frozenset({"alert"}), 5 * S),
                                   lambda: self.writer)  # fmt: skip
            self.observers: list[object] = []

        def add_observer(self, fn: object) -> None:
            self.observers.append(fn)

        def run(self) -> int:
            rows = pa.Table.from_pylist(b.rows["gpu_memory"],
                                        schema=schema.table("gpu_memory").arrow_schema)
            self.writer.append("gpu_memory", rows)
            for fn in self.observers:
                fn("gpu_memory", rows)  # type: ignore[operator]
            self.writer.close()
            return 0

    rec = Rec()
    assert run(rec, LiveOptions(alerts=["gpu_free<1GiB"])) == 0
    m = json.loads((tmp_path / "t" / "manifest.json").read_text())
    assert [(i["trigger"], i["status"]) for i in m["incidents"]] == [("alert", "kept")]
    d = open_trace(tmp_path / "t" / m["incidents"][0]["dir"]).manifest["window"]["detail"]
    assert (d["alert"], d["expr"], d["gpu_index"], d["value"]) == (
        "gpu_free", "gpu_free<1GiB", 0, float(512 << 20))


REAL = Path(__file__).resolve().parents[3] / "fixtures" / "real-h200-driver-cuda" / "trace"


def test_real_h200_oom_incident(tmp_path: Path) -> None:
    """The real H200 capture (fixtures/real-h200-driver-cuda): its cuMemAlloc_v2 of 1 TiB
    failing with CUresult 2, replayed through the freezer as the recorder hands rows
    on (the RM samples up to it first), freezes one incident: capacity, 1 TiB asked,
    the GPU's 139.8 GiB heap with 149,551,185,920 bytes free at the last sample before
    it (49.6436 s), the program itself (pid 776, gpu_workload) the requester."""
    import pyarrow.parquet as pq

    from gputrace.record.freeze import Flight, Freezer

    src = open_trace(REAL)

    def rows(name: str) -> pa.Table:
        """The table's parts as recorded, with the columns added since (null)."""
        got = pa.concat_tables([pq.read_table(p) for p in src.parts(name)])
        want = schema.table(name).arrow_schema
        return pa.table([got[f.name] if f.name in got.schema.names
                         else pa.nulls(got.num_rows, f.type) for f in want], schema=want)

    w = FlightWriter(tmp_path / "t", keep=None, grace_ns=0, rotate_s=1.0)
    f = Freezer(Flight(None, frozenset({"oom"}), 5 * S), lambda: w)
    mem, calls = rows("gpu_memory"), rows("cuda_calls")
    oom_ts = 49_668_966_672
    before = mem.filter(pa.compute.less(mem["ts_ns"], pa.scalar(oom_ts, pa.int64())))
    for name, t in (("gpu_memory", before), ("cuda_calls", calls)):
        w.append(name, t)
        f.observe(name, t)
    w.close()
    m = json.loads((tmp_path / "t" / "manifest.json").read_text())
    assert [i["ts_ns"] for i in m["incidents"]] == [oom_ts]
    inc = open_trace(tmp_path / "t" / m["incidents"][0]["dir"]).manifest["window"]
    assert inc["detail"] == {
        "layer": "api", "call": "cuMemAlloc_v2", "pid": 776, "comm": "gpu_workload",
        "requested_bytes": 1 << 40, "gpu_index": 0, "verdict": "capacity",
        "free_bytes": 149_551_185_920, "largest_free_bytes": 149_535_260_672,
        "heap_bytes": 150_109_880_320,
    }  # fmt: skip
    assert round(inc["detail"]["heap_bytes"] / 2**30, 1) == 139.8
