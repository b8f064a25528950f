"""The UVM tools queue decoder: real H200 bytes against their truth, and synthetic
records of every kind in both layouts, field by field.

The synthetic records are packed here with `struct` from the C declarations in
uvm_types.h (595.45.04), independently of the decoder's offset tables.
"""

from __future__ import annotations

import ast
import json
import lzma
import re
import struct
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from gputrace.record.driver_layer.samples import (
    GpuMemorySample,
    GpuProcessMemorySample,
    counters_table,
    gpu_memory_table,
    gpu_process_memory_table,
)
from gputrace.record.uvm_tools.decode import UvmStreamContext, UvmStreamDecoder
from tests.conftest import ROOT

REAL = ROOT / "fixtures" / "real-h200-uvm"
MiB = 1 << 20
OFFSET = 71_000_000  # CLOCK_MONOTONIC - CLOCK_MONOTONIC_RAW on the H200, 23 s after boot
PROCS = {0: -1, 1: 0, 2: 1}  # tools index -> trace GPU index (the CPU is tools index 0)


def _decode(raw: bytes, version: int, step: int | None = None,
            offset: int = 0) -> tuple[dict[str, pl.DataFrame], UvmStreamDecoder]:
    dec = UvmStreamDecoder(UvmStreamContext(pid=77, version=version, cpu_fault_has_cpu_id=True,
                                            processors={0: -1, 1: 0}))
    size = 72 if version == 2 else 64
    step = len(raw) if step is None else step * size
    parts: dict[str, list[pa.Table]] = {}
    for i in range(0, len(raw), step):
        for k, t in dec.feed(raw[i:i + step], offset).items():
            parts.setdefault(k, []).append(t)
    for k, t in dec.finish().items():
        parts.setdefault(k, []).append(t)
    out = {}
    for k, v in parts.items():
        df = pl.from_arrow(pa.concat_tables(v))
        assert isinstance(df, pl.DataFrame)
        out[k] = df
    return out, dec


@pytest.fixture(scope="module")
def real_raw() -> bytes:
    return lzma.decompress((REAL / "uvm-tools-events.v2.raw.xz").read_bytes())


def _summary_lines(t: dict[str, pl.DataFrame], entries: int) -> list[str]:
    """The real capture's summary.txt, rebuilt from the decoded tables (tools processor
    numbering: CPU 0, the H200 1)."""
    f, b, m = t["faults"], t["fault_batches"], t["migrations"]
    gpu, cpu = f.filter(pl.col("source") != "cpu"), f.filter(pl.col("source") == "cpu")
    sizes = b["faults"]
    by_type = {"cpu_fault": cpu.height, "gpu_fault": gpu.height, "migration": m.height,
               "gpu_fault_replay": int(b["duration_ns"].is_not_null().sum())}
    lines = [
        f"entries {entries} (72 B each)",
        f"by type {by_type}",
        f"gpu fault batches {b.height}, faults/batch min {int(sizes.min())} median "  # type: ignore[arg-type]
        f"{int(sizes.median())} max {int(sizes.max())}; "  # type: ignore[arg-type]
        f"replays {by_type['gpu_fault_replay']}",
        f"gpu fault types {dict(sorted(Counter(gpu['fault_type'].to_list()).items()))} "
        f"access {dict(Counter(gpu['access_type'].to_list()))}",
    ]
    mig = (m.group_by("cause", "src", "dst")
           .agg(pl.len(), pl.col("size_bytes").cast(pl.Int64).sum().alias("b"))
           .sort("len", descending=True))
    for r in mig.iter_rows(named=True):
        lines.append(f"migration cause={r['cause']} {r['src'] + 1}->{r['dst'] + 1}: "
                     f"{r['len']} events, {r['b'] / MiB:.1f} MiB")
    lines.append(f"cpu faults by access {dict(Counter(cpu['access_type'].to_list()))}")
    return lines


def _norm(line: str) -> str:
    """Dicts in a line compare by content (their key order is the printer's, not a fact)."""
    return re.sub(r"\{[^{}]*\}",
                  lambda m: repr(sorted(ast.literal_eval(m.group(0)).items())), line)


def test_real_h200_bytes_reproduce_the_summary(real_raw: bytes) -> None:
    t, dec = _decode(real_raw, 2)
    assert (dec.bad_records, dec.unmapped_records) == (0, 0)
    want = (REAL / "uvm-tools-events.summary.txt").read_text().splitlines()
    got = _summary_lines(t, len(real_raw) // 72)
    assert sorted(map(_norm, got)) == sorted(map(_norm, want))


def test_real_h200_tallies_match_the_json_and_issue(real_raw: bytes) -> None:
    facts = json.loads((REAL / "uvm-tools-events.json").read_text())
    t, dec = _decode(real_raw, 2)
    assert sum(dec.events.values()) == facts["entries"] == 82_042
    assert {str(k): v for k, v in dec.events.items()} == facts["by_type"]
    b = t["fault_batches"]
    assert (b.height, int(b["faults"].sum()), b["faults"].min(), b["faults"].median(),
            b["faults"].max()) == (665, 80_035, 56, 101, 256)
    assert b["duration_ns"].null_count() == 0 and int(b["duration_ns"].min()) > 0  # type: ignore[arg-type]
    f = t["faults"]
    gpu = f.filter(pl.col("source") == "gpu_replayable")
    assert gpu.height == 80_035 and set(gpu["gpu_index"].to_list()) == {0}
    assert dict(Counter(gpu["fault_type"].to_list())) == {"invalid_pde": 14_680,
                                                          "invalid_pte": 65_355}
    cpu = f.filter(pl.col("source") == "cpu")
    assert dict(Counter(cpu["access_type"].to_list())) == {"write": 192, "read": 48}
    m = t["migrations"]
    htod = int(m.filter(pl.col("dst") == 0)["size_bytes"].sum())
    dtoh = int(m.filter(pl.col("dst") == -1)["size_bytes"].sum())
    # the counter tracker saw the same bytes move: 64 MiB to the GPU, 48 MiB back
    assert (htod, dtoh) == (facts["counters"][0], facts["counters"][1])


def test_real_h200_decodes_the_same_in_small_drains(real_raw: bytes) -> None:
    """Batches open across drains close when their replay arrives in a later drain."""
    whole, _ = _decode(real_raw, 2)
    pieces, dec = _decode(real_raw, 2, step=997, offset=0)
    assert dec.bad_records == 0
    for name in ("faults", "fault_batches", "migrations"):
        cols = whole[name].columns
        assert pieces[name].sort(cols, nulls_last=True).equals(
            whole[name].sort(cols, nulls_last=True))


def test_clock_offset_moves_every_cpu_timestamp(real_raw: bytes) -> None:
    a, _ = _decode(real_raw, 2, offset=0)
    b, _ = _decode(real_raw, 2, offset=OFFSET)
    for name in ("faults", "fault_batches", "migrations"):
        assert (b[name]["ts_ns"] - a[name]["ts_ns"]).unique().to_list() == [OFFSET]
        if "ts_gpu_ns" in a[name].columns:  # the GPU timer is not a CPU clock
            assert a[name]["ts_gpu_ns"].equals(b[name]["ts_gpu_ns"])


def _ts_raw(raw: bytes) -> list[int]:
    """The CPU timestamp (bytes 16..24 of a V2 record: faults, replays) of each record."""
    return [struct.unpack_from("<Q", raw, i + 16)[0] for i in range(0, len(raw), 72)]


def test_clock_map_is_a_function_of_the_raw_time(real_raw: bytes) -> None:
    """Drains converted with points measured after each of them (offsets that move
    by hundreds of ns, as NTP slews) give exactly what one feed through the final map
    gives: a fault and its duplicates (same raw time) split across drains get the
    same converted time, and converted times keep the raw order."""
    from gputrace.record.uvm_tools.clock import RawClock

    step = 997 * 72
    pieces = [real_raw[i:i + step] for i in range(0, len(real_raw), step)]
    ts = _ts_raw(real_raw)
    clock = RawClock()
    clock.add(min(ts) - 10_000_000, min(ts) - 10_000_000 + OFFSET)
    dec = UvmStreamDecoder(UvmStreamContext(pid=77, version=2, cpu_fault_has_cpu_id=True,
                                            processors={0: -1, 1: 0}))
    got: dict[str, list[pa.Table]] = {}
    for k, piece in enumerate(pieces):
        after = max(_ts_raw(piece)) + 1 + 6_000_000 * k  # measured after the drain
        clock.add(after, after + OFFSET + (-1) ** k * 300 * k)
        for name, t in dec.feed(piece, clock.snapshot()).items():
            got.setdefault(name, []).append(t)
    assert len(clock) == len(pieces) + 1  # points 6 ms apart are all kept
    whole, _ = _decode(real_raw, 2, offset=0)
    final = clock.snapshot()
    for name in ("faults", "migrations"):
        df = pl.from_arrow(pa.concat_tables(got[name]))
        assert isinstance(df, pl.DataFrame)
        raw = whole[name]["ts_ns"].to_numpy()
        want = whole[name].with_columns(ts_ns=pl.Series(final(raw)))
        cols = whole[name].columns
        assert df.sort(cols, nulls_last=True).equals(want.sort(cols, nulls_last=True))
        pairs = pl.DataFrame({"raw": raw, "mono": final(raw)}).unique().sort("raw")
        assert pairs["raw"].n_unique() == pairs.height  # equal raw -> one converted time
        assert pairs["mono"].diff().drop_nulls().min() >= 0  # order kept
    assert final(np.array([0], np.int64))[0] == OFFSET  # before the first point: held


def test_clock_points_are_clamped_and_thinned() -> None:
    """A noisy point moves the offset at most 1000 ppm of the raw time since the last
    one (the map stays monotone); a point closer than MIN_GAP_NS to the one before
    replaces the previous point unless a snapshot already handed it out. Synthetic."""
    from gputrace.record.uvm_tools.clock import MIN_GAP_NS, RawClock

    ms, base = 1_000_000, 100_000_000
    c = RawClock()
    c.add(1000 * ms, 1000 * ms + base)
    c.add(1010 * ms, 1010 * ms + base + 50_000)  # +50 us in 10 ms: clamped to +10 us
    c.add(1011 * ms, 1011 * ms + base + 9_100)  # -900 ns in 1 ms: inside the band
    assert c.offsets().tolist() == [base, base + 10_000, base + 9_100]
    c.add(1013 * ms, 1013 * ms + base + 14_100)  # 3 ms after point 1: replaces point 2,
    assert c.offsets().tolist() == [base, base + 10_000, base + 13_000]  # clamped
    m = c.snapshot()
    c.add(1014 * ms, 1014 * ms + base + 13_000)  # point 2 is sealed now: appended
    assert len(c) == 4
    assert m.raw.tolist() == [1000 * ms, 1010 * ms, 1013 * ms]  # the snapshot is unchanged
    c.add(1013 * ms, 0)  # raw time going back: ignored
    assert len(c) == 4
    raw = np.arange(999 * ms, 1016 * ms, 997, dtype=np.int64)
    mono = c.snapshot()(raw)
    assert (np.diff(mono) > 0).all()
    assert 3 * ms < MIN_GAP_NS < 10 * ms


# ------------------------------------------------------- synthetic records (synthetic)
V1: dict[str, str] = {
    "cpu_fault": "<BBHIQQIIQ",  # type access pad16 cpuId address ts pid tid pc
    "migration": "<BBBBIQQQQQQQ",  # type cause src dst pad address bytes begin end rg bg eg
    "gpu_fault": "<BBBBHHQQQIBBH",  # type ftype access gpu gpc client addr ts tsg batch ct
    "replay": "<BBBBIQQ",  # type gpu ct pad batch ts tsg
    "fatal": "<BBBBBBHQQ",  # type ftype access processor reason pad pad address ts
    "read_dup": "<BBHIQQQQ",  # type pad pad pad processors address size ts
    "read_dup_inv": "<BBHIQQQ",  # type resident pad pad address size ts
    "thrashing": "<BBHIQQQQ",  # type pad pad pad processors address size ts
    "throttle": "<BBHIQQ",  # type processor pad pad address ts
    "map_remote": "<BBBBIQQQQ",  # type src dst cause pad address size ts tsg
}
V2: dict[str, str] = {
    "cpu_fault": "<BBHIQQIIQ",
    "migration": "<BBHHHiiQQQQQQQ",  # type cause pad src dst srcNid dstNid address ...
    "gpu_fault": "<BBHHHQQQIBBH",  # type ftype gpu gpc client addr ts tsg batch ct access
    "replay": "<BBHIQQ",  # type ct gpu batch ts tsg
    "fatal": "<BBBBHHQQ",  # type ftype access reason processor pad address ts
    "read_dup": "<BBHIQQQ5Q",  # type pad pad pad address size ts processors[5]
    "read_dup_inv": "<BBHIQQQ",  # type pad resident(u16) pad address size ts
    "thrashing": "<BBHIQQQ5Q",
    "throttle": "<BBHIQQ",  # type pad processor(u16) pad address ts
    "map_remote": "<BBHHHQQQQ",  # type cause pad src dst address size ts tsg
}
A = 0x7F00_1234_5000
T = 5_000_000_000  # raw CPU clock of the first record


def _rec(version: int, kind: str, *fields: int) -> bytes:
    body = struct.pack((V1 if version == 1 else V2)[kind], *fields)
    size = 64 if version == 1 else 72
    assert len(body) <= size
    return body + bytes(size - len(body))


def synthetic_stream(v: int) -> bytes:
    """One record of every kind (two GPU fault batches on GPUs 0 and 1), synthetic."""
    r = []
    r.append(_rec(v, "cpu_fault", 1, 2, 0, 7, A, T + 1, 77, 78, 0x401234))
    if v == 1:
        r.append(_rec(v, "migration", 2, 4, 1, 0, 0, A, 2 * MiB, T + 2, T + 9, 5, 900, 950))
        r.append(_rec(v, "migration", 2, 1, 0, 2, 0, A + MiB, 4096, T + 3, 0, 0, 0, 0))
    else:
        r.append(_rec(v, "migration", 2, 4, 0, 1, 0, 3, -1, A, 2 * MiB, T + 2, T + 9, 5,
                      900, 950))
        r.append(_rec(v, "migration", 2, 1, 0, 0, 2, -1, 1, A + MiB, 4096, T + 3, 0, 0, 0, 0))
    # batch 11 on tools GPU 1 (GPC, replayable): 3 faults, one a duplicate
    for i, (ftype, acc, addr) in enumerate(((1, 2, A), (2, 2, A), (2, 2, A + 4096))):
        if v == 1:
            r.append(_rec(v, "gpu_fault", 3, ftype, acc, 1, 5, 0x21, addr, T + 10 + i,
                          1000 + i, 11, 1, 0, 0))
        else:
            r.append(_rec(v, "gpu_fault", 3, ftype, 1, 5, 0x21, addr, T + 10 + i, 1000 + i,
                          11, 1, acc, 0))
    # batch 3 on tools GPU 2 (HUB, non-replayable): one atomic fault of type write
    if v == 1:
        r.append(_rec(v, "gpu_fault", 3, 3, 3, 2, 9, 0x40, A + 2 * MiB, T + 20, 2000, 3, 2,
                      0, 0))
        r.append(_rec(v, "replay", 4, 1, 1, 0, 11, T + 30, 3000))
        r.append(_rec(v, "replay", 4, 2, 2, 0, 3, T + 40, 4000))
        r.append(_rec(v, "fatal", 6, 6, 1, 2, 4, 0, 0, A + 8, T + 50))
        r.append(_rec(v, "read_dup", 7, 0, 0, 0, 0b111, A, 64 * 1024, T + 60))
        r.append(_rec(v, "read_dup_inv", 8, 2, 0, 0, A, 64 * 1024, T + 61))
        r.append(_rec(v, "thrashing", 10, 0, 0, 0, 0b101, A, 2 * MiB, T + 70))
        r.append(_rec(v, "throttle", 11, 1, 0, 0, A, T + 71))
        r.append(_rec(v, "throttle", 12, 1, 0, 0, A, T + 79))
        r.append(_rec(v, "map_remote", 13, 2, 0, 2, 0, A, 2 * MiB, T + 80, 5000))
    else:
        r.append(_rec(v, "gpu_fault", 3, 3, 2, 9, 0x40, A + 2 * MiB, T + 20, 2000, 3, 2, 3,
                      0))
        r.append(_rec(v, "replay", 4, 1, 1, 11, T + 30, 3000))
        r.append(_rec(v, "replay", 4, 2, 2, 3, T + 40, 4000))
        r.append(_rec(v, "fatal", 6, 6, 1, 4, 2, 0, A + 8, T + 50))
        r.append(_rec(v, "read_dup", 7, 0, 0, 0, A, 64 * 1024, T + 60, 0b111, 0, 0, 0, 0))
        r.append(_rec(v, "read_dup_inv", 8, 0, 2, 0, A, 64 * 1024, T + 61))
        r.append(_rec(v, "thrashing", 10, 0, 0, 0, A, 2 * MiB, T + 70, 0b101, 0, 0, 0, 0))
        r.append(_rec(v, "throttle", 11, 0, 1, 0, A, T + 71))
        r.append(_rec(v, "throttle", 12, 0, 1, 0, A, T + 79))
        r.append(_rec(v, "map_remote", 13, 2, 0, 2, 0, A, 2 * MiB, T + 80, 5000))
    return b"".join(r)


def _rows(t: pa.Table) -> list[dict[str, Any]]:
    return t.to_pylist()


@pytest.mark.parametrize("version", [1, 2])
def test_synthetic_records_field_by_field(version: int) -> None:
    dec = UvmStreamDecoder(UvmStreamContext(pid=77, version=version, cpu_fault_has_cpu_id=True,
                                            processors=PROCS))
    out = dec.feed(synthetic_stream(version), 100)
    assert (dec.bad_records, dec.unmapped_records) == (0, 0)
    assert dec.finish() == {}
    cpu, g0a, g0b, g0c, g1 = _rows(out["faults"])
    assert cpu == {
        "ts_ns": T + 101, "pid": 77, "tid": 78, "comm": None, "source_code": 1,
        "source": "cpu", "gpu_index": None, "address": A, "block_2m": A & ~(2 * MiB - 1),
        "fault_type_code": 255, "fault_type": "unknown", "access_type_code": 2,
        "access_type": "write", "instances": None, "batch_id": None, "ip": 0x401234,
        "ts_gpu_ns": None, "gpc_id": None, "channel_id": None, "client_id": None,
        "cpu_id": 7}
    assert g0a == {
        "ts_ns": T + 110, "pid": 77, "tid": None, "comm": None, "source_code": 2,
        "source": "gpu_replayable", "gpu_index": 0, "address": A,
        "block_2m": A & ~(2 * MiB - 1), "fault_type_code": 0, "fault_type": "invalid_pde",
        "access_type_code": 2, "access_type": "write", "instances": None, "batch_id": 11,
        "ip": None, "ts_gpu_ns": 1000, "gpc_id": 5, "channel_id": None, "client_id": 0x21,
        "cpu_id": None}
    assert (g0b["fault_type"], g0b["ts_gpu_ns"], g0c["address"]) == ("invalid_pte", 1001,
                                                                      A + 4096)
    assert {k: g1[k] for k in ("ts_ns", "source", "gpu_index", "fault_type", "access_type",
                               "batch_id", "gpc_id", "channel_id", "client_id")} == {
        "ts_ns": T + 120, "source": "gpu_non_replayable", "gpu_index": 1,
        "fault_type": "write", "access_type": "atomic", "batch_id": 3, "gpc_id": None,
        "channel_id": 9, "client_id": 0x40}
    b11, b3 = _rows(out["fault_batches"])
    assert b11 == {"ts_ns": T + 110, "pid": 77, "gpu_index": 0, "batch_id": 11,
                   "source_code": 2, "source": "gpu_replayable", "faults": 3, "duplicates": 1,
                   "duration_ns": 20, "replay_ts_gpu_ns": 3000}
    assert b3 == {"ts_ns": T + 120, "pid": 77, "gpu_index": 1, "batch_id": 3,
                  "source_code": 3, "source": "gpu_non_replayable", "faults": 1,
                  "duplicates": 0, "duration_ns": 20, "replay_ts_gpu_ns": 4000}
    m1, m2 = _rows(out["migrations"])
    assert m1 == {"ts_ns": T + 102, "pid": 77, "src": 0, "dst": -1, "address": A,
                  "size_bytes": 2 * MiB, "cause_code": 5, "cause": "eviction",
                  "duration_ns": 7, "ts_gpu_ns": 900, "duration_gpu_ns": 50,
                  "src_nid": None if version == 1 else 3,
                  "dst_nid": None if version == 1 else -1}
    assert {k: m2[k] for k in ("src", "dst", "size_bytes", "cause", "duration_ns",
                               "ts_gpu_ns", "duration_gpu_ns")} == {
        "src": -1, "dst": 1, "size_bytes": 4096, "cause": "user", "duration_ns": None,
        "ts_gpu_ns": None, "duration_gpu_ns": None}
    ev = {r["kind"]: r for r in _rows(out["uvm_events"])}
    assert list(ev) == ["fatal_fault", "read_duplicate", "read_duplicate_invalidate",
                        "thrashing", "throttling_start", "throttling_end", "map_remote"]
    assert ev["fatal_fault"] == {
        "ts_ns": T + 150, "pid": 77, "kind_code": 6, "kind": "fatal_fault", "processor": 1,
        "residency": None, "processors": None, "address": A + 8, "size_bytes": None,
        "reason_code": 4, "reason": "out_of_memory", "fault_type_code": 6,
        "fault_type": "va_limit_violation", "access_type_code": 1, "access_type": "read",
        "ts_gpu_ns": None}
    assert (ev["read_duplicate"]["processors"], ev["read_duplicate"]["size_bytes"]) == (
        "-1,0,1", 64 * 1024)
    assert ev["read_duplicate_invalidate"]["processor"] == 1
    assert (ev["thrashing"]["processors"], ev["thrashing"]["size_bytes"],
            ev["thrashing"]["ts_ns"]) == ("-1,1", 2 * MiB, T + 170)
    assert (ev["throttling_start"]["processor"], ev["throttling_end"]["ts_ns"]) == (0, T + 179)
    assert {k: ev["map_remote"][k] for k in ("processor", "residency", "reason", "size_bytes",
                                             "ts_gpu_ns")} == {
        "processor": 1, "residency": -1, "reason": "thrashing", "size_bytes": 2 * MiB,
        "ts_gpu_ns": 5000}


def test_cpu_id_is_null_before_565() -> None:
    dec = UvmStreamDecoder(UvmStreamContext(pid=1, version=1, cpu_fault_has_cpu_id=False,
                                            processors=PROCS))
    out = dec.feed(_rec(1, "cpu_fault", 1, 1, 0, 0xDEAD, A, T, 1, 1, 0), 0)
    assert out["faults"]["cpu_id"].to_pylist() == [None]
    assert out["faults"]["access_type"].to_pylist() == ["read"]


def test_bad_records_are_counted_never_raised() -> None:
    dec = UvmStreamDecoder(UvmStreamContext(pid=1, version=2, cpu_fault_has_cpu_id=True,
                                            processors={0: -1}))  # GPU 1 unknown
    good = synthetic_stream(2)
    junk = bytes([0]) + bytes(71) + bytes([99]) + bytes(71) + bytes([14]) + bytes(71)
    out = dec.feed(good + junk + b"\x03" * 10, 0)  # 3 bad records, a truncated tail
    assert dec.bad_records == 4
    assert dec.unmapped_records > 0  # GPU faults on unknown processors: gpu_index null
    assert out["faults"]["gpu_index"].null_count == 5  # 4 GPU faults + the CPU fault
    assert "migrations" not in out  # both name an unknown processor: dropped, counted


def test_fault_batch_without_replay_is_flushed_by_finish() -> None:
    dec = UvmStreamDecoder(UvmStreamContext(pid=5, version=2, cpu_fault_has_cpu_id=True,
                                            processors=PROCS))
    f = _rec(2, "gpu_fault", 3, 1, 1, 0, 0, A, T, 1, 42, 1, 2, 0)
    assert "fault_batches" not in dec.feed(f, 0)
    (row,) = dec.finish()["fault_batches"].to_pylist()
    assert (row["batch_id"], row["faults"], row["duration_ns"], row["gpu_index"]) == (
        42, 1, None, 0)


def test_set_processors_maps_gpus_registered_later() -> None:
    dec = UvmStreamDecoder(UvmStreamContext(pid=5, version=2, cpu_fault_has_cpu_id=True,
                                            processors={0: -1}))
    dec.set_processors({2: 1})
    out = dec.feed(_rec(2, "gpu_fault", 3, 1, 2, 0, 0, A, T, 1, 1, 1, 2, 0), 0)
    assert out["faults"]["gpu_index"].to_pylist() == [1]


def test_counters_and_gpu_memory_tables() -> None:
    c = counters_table(123, 9, [67_108_864, 50_331_648, 240, 0, 0, 0, 0, 5, 6, 70_813])
    assert c.to_pylist() == [
        {"ts_ns": 123, "pid": 9, "counter_code": k, "counter": n, "value": v}
        for k, n, v in ((0, "bytes_htod", 67_108_864), (1, "bytes_dtoh", 50_331_648),
                        (2, "cpu_faults", 240), (7, "prefetch_bytes_htod", 5),
                        (8, "prefetch_bytes_dtoh", 6), (9, "gpu_faults", 70_813))]
    g = gpu_memory_table([GpuMemorySample(1, 0, 0, 10, 5, 4, 2),
                          GpuMemorySample(2, 1, 0x59, 10, 5, 4, 2, "incident", 1234)])
    assert g.to_pylist() == [
        {"ts_ns": 1, "gpu_index": 0, "heap_size_bytes": 10, "heap_free_bytes": 5,
         "largest_free_bytes": 4, "largest_free_base_bytes": 2, "status": 0,
         "trigger": "tick", "delay_ns": None},
        {"ts_ns": 2, "gpu_index": 1, "heap_size_bytes": None, "heap_free_bytes": None,
         "largest_free_bytes": None, "largest_free_base_bytes": None, "status": 0x59,
         "trigger": "incident", "delay_ns": 1234}]
    p = gpu_process_memory_table([GpuProcessMemorySample(3, 0, 4242, 0, 96 << 20),
                                  GpuProcessMemorySample(4, 0, 4243, 0x1f, 7, "incident")])
    assert p.to_pylist() == [
        {"ts_ns": 3, "gpu_index": 0, "pid": 4242, "vidmem_bytes": 96 << 20,
         "trigger": "tick", "status": 0},
        {"ts_ns": 4, "gpu_index": 0, "pid": 4243, "vidmem_bytes": None,
         "trigger": "incident", "status": 0x1f}]


@pytest.mark.parametrize("module", ["uvm_tools/decode", "uvm_tools/records", "uvm_tools/batches",
                                    "arrow_columns", "driver_layer/samples"])
def test_decoder_imports_nothing_from_bcc(module: str) -> None:
    src = (ROOT / "gputrace" / "record" / f"{module}.py").read_text()
    assert "bcc" not in re.findall(r"^(?:from|import) (\S+)", src, re.M)
    assert not any(m.startswith("bcc") for m in re.findall(r"^(?:from|import) (\S+)", src,
                                                             re.M))


def test_real_fixture_provenance_exists() -> None:
    prov = json.loads((REAL / "PROVENANCE.json").read_text())
    assert prov["synthetic"] is False and "H200" in prov["hardware"]
    assert Path(REAL / "trace" / "manifest.json").exists()


def _fault(batch: int, addr: int, access: int = 2, ts: int = T) -> bytes:
    return _rec(2, "gpu_fault", 3, 1, 1, 0, 0, addr, ts, 1, batch, 1, access, 0)


def _replay(batch: int, ts: int) -> bytes:
    return _rec(2, "replay", 4, 1, 1, batch, ts, 7)


def test_duplicates_and_first_fault_span_drains() -> None:
    """A batch's faults split over three drains (synthetic): a pair seen in an earlier
    drain is a duplicate when it comes again; the same address with another access
    type is not; the first fault is the earliest of all drains."""
    dec = UvmStreamDecoder(UvmStreamContext(pid=5, version=2, cpu_fault_has_cpu_id=True,
                                            processors=PROCS))
    assert "fault_batches" not in dec.feed(_fault(7, A, ts=T + 5) + _fault(8, A), 0)
    dec.feed(_fault(7, A + 4096, ts=T + 9) + _fault(7, A, ts=T + 3), 10)
    out = dec.feed(_fault(7, A, access=1, ts=T + 1) + _fault(7, A + 4096, ts=T + 8)
                   + _replay(7, T + 50)
                   + _replay(9, T + 60), 0)
    b7, b9 = out["fault_batches"].to_pylist()
    assert (b7["batch_id"], b7["faults"], b7["duplicates"], b7["ts_ns"], b7["duration_ns"]) == (
        7, 5, 2, T + 1, 49)
    assert (b9["batch_id"], b9["faults"], b9["duplicates"], b9["ts_ns"]) == (9, None, None,
                                                                             T + 60)
    (b8,) = dec.finish()["fault_batches"].to_pylist()
    assert (b8["batch_id"], b8["faults"], b8["duplicates"], b8["duration_ns"]) == (
        8, 1, 0, None)
    assert dec.finish() == {}


def test_a_batch_reopened_after_its_replay_starts_afresh() -> None:
    """Faults arriving after their batch closed form a new batch (synthetic)."""
    dec = UvmStreamDecoder(UvmStreamContext(pid=5, version=2, cpu_fault_has_cpu_id=True,
                                            processors=PROCS))
    (first,) = dec.feed(_fault(3, A) + _fault(3, A) + _replay(3, T + 9), 0)[
        "fault_batches"].to_pylist()
    dec.feed(_fault(3, A), 0)
    (again,) = dec.feed(_replay(3, T + 20) + _replay(3, T + 30), 0)["fault_batches"].to_pylist()
    assert (first["faults"], first["duplicates"]) == (2, 1)
    assert (again["faults"], again["duplicates"], again["duration_ns"]) == (1, 0, 20)


@pytest.mark.parametrize("alternate", [False, True])
def test_enum_names_in_long_and_short_runs(alternate: bool) -> None:
    """Enum names are right whether codes come in runs or alternate (two build paths)."""
    dec = UvmStreamDecoder(UvmStreamContext(pid=5, version=2, cpu_fault_has_cpu_id=True,
                                            processors=PROCS))
    types = [(i % 2) if alternate else (i // 300) for i in range(600)]  # tools 0/1
    raw = b"".join(_rec(2, "gpu_fault", 3, 1 + t, 1, 0, 0, A + i * 4096, T + i, 1, 1, 1,
                        1 + t, 0) for i, t in enumerate(types))
    f = dec.feed(raw, 0)["faults"]
    f.validate(full=True)
    assert f["fault_type"].to_pylist() == [("invalid_pde", "invalid_pte")[t] for t in types]
    assert f["access_type"].to_pylist() == [("read", "write")[t] for t in types]
    assert f["source"].to_pylist() == ["gpu_replayable"] * 600
