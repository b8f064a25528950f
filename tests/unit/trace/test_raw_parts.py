"""Raw parts (`record --raw`), `gputrace convert`, and readers refusing raw traces.

All data here is SYNTHETIC: ioctl records are made up with numpy (random but
seeded field values of `decode.IOCTL_DTYPE`), never captured from a driver. No
BPF, no root. Expected answers are computed from those inputs in the tests.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest

from gputrace import schema
from gputrace.cli import main
from gputrace.errors import TraceError
from gputrace.importers import raw as rawconvert
from gputrace.record import decode
from gputrace.trace import rawparts
from gputrace.trace.reader import open_trace
from gputrace.trace.writer import TraceWriter

RECORD = "ioctl_event"
DT = decode.IOCTL_DTYPE
KNOWN_DEVICES = (1, 2, 3)  # ctl, gpu, uvm in schema.DEVICE_KINDS
NULLABLE_BITS = {"status": 0, "h_client": 1, "h_class": 4, "size_bytes": 5, "flags": 10}


def _events(n: int, seed: int, t0: int = 1_000_000, devices: tuple[int, ...] = KNOWN_DEVICES,
            ) -> np.ndarray:  # fmt: skip
    """`n` synthetic ioctl records, ts_ns unique but out of order, several pids/tids."""
    rng = np.random.default_rng(seed)
    ev = np.zeros(n, DT)
    ev["ts_ns"] = t0 + rng.permutation(n).astype(np.uint64) * 1000 + 7
    ev["latency_ns"] = rng.integers(100, 100_000, n)
    ev["ret"] = rng.integers(-3, 3, n)
    ev["size_bytes"] = rng.integers(1, 1 << 32, n)
    ev["va_base"] = rng.integers(1 << 20, 1 << 40, n)
    ev["flags"] = rng.integers(0, 1 << 16, n)
    ev["status"] = rng.integers(0, 0x60, n)
    ev["h_client"] = rng.integers(1, 1 << 31, n)
    ev["h_class"] = rng.integers(1, 0xFFFF, n)
    pids = rng.choice(np.array([100, 2000, 31337], np.uint32), n)
    ev["pid"] = pids
    ev["tid"] = pids + rng.integers(0, 3, n).astype(np.uint32)
    ev["fd"] = rng.integers(3, 50, n)
    dev = rng.choice(np.array(devices, np.uint8), n)
    ev["device"] = dev
    ev["gpu_index"] = np.where(dev == 2, rng.integers(0, 8, n), -1)
    ev["nr"] = np.where(np.isin(dev, (3, 4)), rng.choice([1, 21, 75], n),
                        rng.choice([0x2B, 0x29, 0x2A], n))  # fmt: skip
    ev["cmd"] = 0xC0000000 | ev["nr"]
    ev["valid"] = rng.integers(0, 1 << 15, n)  # every bit but gpu_uuid, at random
    ev["comm"] = [f"proc{p}".encode() for p in pids]
    return ev


def _decoded(ev: np.ndarray) -> Any:
    batch, bad = decode.ioctl_rows(ev)
    assert bad == 0 and batch is not None
    return batch


def _manifest(p: Path) -> dict[str, Any]:
    out: dict[str, Any] = json.loads((p / "manifest.json").read_text())
    return out


def _raw_trace(p: Path, chunks: list[np.ndarray], manifest: dict[str, Any] | None = None) -> Path:
    """One raw part per chunk (one rotation each)."""
    w = TraceWriter(p, manifest=manifest)
    for c in chunks:
        w.append_raw("ioctls", RECORD, DT, c.tobytes())
        w.rotate()
    w.close()
    return p


def _files(p: Path) -> list[str]:
    return sorted(os.listdir(p / "ioctls"))


def _table(p: Path) -> pl.DataFrame:
    return open_trace(p).scan("ioctls").collect().sort(["ts_ns", "tid"])


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("gputrace: error: "), err
    assert "Traceback" not in err
    return lines[0]


# ------------------------------------------------------------------ round trip
def test_round_trip_raw_equals_decoded(tmp_path: Path) -> None:
    chunks = [_events(300, 1), _events(200, 2, t0=5_000_000), _events(257, 3, t0=100)]
    total = sum(len(c) for c in chunks)
    a = tmp_path / "decoded"
    w = TraceWriter(a)
    for c in chunks:
        w.append("ioctls", _decoded(c))
        w.rotate()
    w.close()
    b = _raw_trace(tmp_path / "raw", chunks)
    assert _files(b) == [rawparts.raw_part_name(i) for i in (1, 2, 3)]
    assert _manifest(b)["tables"]["ioctls"] == {
        "rows": 0, "parts": 0, "raw_parts": 3, "raw_records": total}  # fmt: skip

    done = rawconvert.convert(b)
    assert (done.parts, done.rows, done.skipped, done.tables) == (3, total, 0, ["ioctls"])
    assert _files(b) == [f"part-{i:06d}.parquet" for i in (1, 2, 3)]
    m = _manifest(b)
    assert m["tables"]["ioctls"] == {"rows": total, "parts": 3}
    assert m["decode_errors"]["ioctl_events"] == 0
    assert "converted" in m

    da, db = _table(a), _table(b)
    assert db.height == total
    assert db.equals(da)
    # checked against the inputs themselves, not only against the decoder
    ev = np.concatenate(chunks)
    ev = ev[np.lexsort((ev["tid"], ev["ts_ns"]))]
    assert db["ts_ns"].to_list() == ev["ts_ns"].astype(int).tolist()
    assert db["pid"].to_list() == ev["pid"].astype(int).tolist()
    assert db["tid"].to_list() == ev["tid"].astype(int).tolist()
    assert db["latency_ns"].to_list() == ev["latency_ns"].astype(int).tolist()
    assert db["device"].to_list() == [schema.DEVICE_KINDS[int(d)] for d in ev["device"]]
    assert db["gpu_index"].to_list() == [int(g) if g >= 0 else None for g in ev["gpu_index"]]
    for col, bit in NULLABLE_BITS.items():
        pairs = zip(ev[col], ev["valid"], strict=True)
        want = [int(v) if (m_ >> bit) & 1 else None for v, m_ in pairs]
        assert db[col].to_list() == want, col
    for i, c in enumerate(chunks, 1):  # each part: its chunk, sorted by time
        part = pq.read_table(b / "ioctls" / f"part-{i:06d}.parquet")
        ts = part.column("ts_ns").to_pylist()
        assert ts == sorted(c["ts_ns"].astype(int).tolist())
    assert open_trace(b).rows("ioctls") == total


# -------------------------------------------------------------- unknown device
def test_unknown_device_records_skipped_and_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chunks = [_events(120, 4, devices=(1, 2, 3, 9)), _events(80, 5, t0=9_000_000,
                                                             devices=(0, 3, 200))]  # fmt: skip
    bad = sum(int(np.count_nonzero(~np.isin(c["device"], list(schema.DEVICE_KINDS))))
              for c in chunks)  # fmt: skip
    assert bad > 0
    total = sum(len(c) for c in chunks)
    p = _raw_trace(tmp_path / "t", chunks, manifest={"decode_errors": {"ioctl_events": 2}})
    rc, out, err = _cli(capsys, "convert", str(p))
    assert rc == 0, err
    assert f"{bad} records skipped" in out
    assert f"into {total - bad} rows" in out
    m = _manifest(p)
    assert m["decode_errors"]["ioctl_events"] == 2 + bad
    assert m["tables"]["ioctls"] == {"rows": total - bad, "parts": 2}
    df = _table(p)
    assert df.height == total - bad
    assert set(df["device"].to_list()) <= {"unknown", "ctl", "gpu", "uvm"}


# ---------------------------------------------------------- readers refuse raw
def test_open_trace_and_readers_refuse_unconverted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = _raw_trace(tmp_path / "t", [_events(10, 6)])
    with pytest.raises(TraceError, match="gputrace convert"):
        open_trace(p)
    for args in (["analyze", str(p)], ["dump", str(p), "ioctls"],
                 ["export", str(p), "--to", str(tmp_path / "ds")]):  # fmt: skip
        rc, _out, err = _cli(capsys, *args)
        assert rc != 0, args
        line = _one_error_line(err)
        assert "gputrace convert" in line, args
    # info reads the manifest: it says what the raw parts hold and how to decode them
    rc, out, err = _cli(capsys, "info", str(p), "--json")
    assert rc == 0, err
    facts = json.loads(out)
    assert facts["rows"]["ioctls"] == 0
    held = [w for w in facts["warnings"] if "raw parts not decoded yet" in w]
    assert len(held) == 1 and "1 of ioctls" in held[0] and "10 ioctls records" in held[0]
    assert f"gputrace convert {p}" in held[0]
    rawconvert.convert(p)
    rc, out, err = _cli(capsys, "info", str(p), "--json")
    assert rc == 0, err
    facts = json.loads(out)
    assert facts["rows"]["ioctls"] == 10
    assert not [w for w in facts["warnings"] if "raw parts" in w]


# ---------------------------------------------------- truncated / damaged parts
FH = 12  # a frame's header: u32 raw length, u32 compressed length, u32 CRC-32


def _layout_offsets(data: bytes) -> dict[str, int]:
    m = len(rawparts.MAGIC)
    (hlen,) = struct.unpack_from("<I", data, m)
    f1 = m + 4 + hlen
    _n1, c1 = struct.unpack_from("<II", data, f1)
    f2 = f1 + FH + c1
    _n2, c2 = struct.unpack_from("<II", data, f2)
    assert f2 + FH + c2 == len(data)
    return {"magic": 3, "header length": m + 2, "header json": m + 4 + hlen // 2,
            "frame header": f1 + 5, "frame body": f1 + FH + c1 // 2,
            "second frame header": f2 + 3, "second frame body": f2 + FH + c2 - 1,
            "frame1 start": f1, "frame2 start": f2}  # fmt: skip


def _two_frame_part(p: Path) -> tuple[Path, bytes]:
    w = TraceWriter(p)
    w.append_raw("ioctls", RECORD, DT, _events(64, 7).tobytes())
    w.append_raw("ioctls", RECORD, DT, _events(64, 8, t0=7_000_000).tobytes())
    w.close()
    part = p / "ioctls" / rawparts.raw_part_name(1)
    return part, part.read_bytes()


def _assert_refused_untouched(p: Path, part: Path, data: bytes) -> None:
    manifest = (p / "manifest.json").read_bytes()
    with pytest.raises(TraceError) as e:
        rawconvert.convert(p)
    assert str(part) in str(e.value)
    assert "\n" not in str(e.value)
    assert part.read_bytes() == data  # nothing lost
    assert _files(p) == [part.name]  # no Parquet part, no temporary file
    assert (p / "manifest.json").read_bytes() == manifest


@pytest.mark.parametrize("where", ["magic", "header length", "header json", "frame header",
                                   "frame body", "second frame header",
                                   "second frame body"])  # fmt: skip
def test_truncated_raw_part_refused_and_kept(tmp_path: Path, where: str) -> None:
    p = tmp_path / "t"
    part, data = _two_frame_part(p)
    cut = data[: _layout_offsets(data)[where]]
    part.write_bytes(cut)
    _assert_refused_untouched(p, part, cut)


def test_corrupt_frame_magic_refused_and_kept(tmp_path: Path) -> None:
    p = tmp_path / "t"
    part, data = _two_frame_part(p)
    off = _layout_offsets(data)["frame2 start"] + FH  # the zstd frame's own magic
    bad = bytearray(data)
    bad[off : off + 4] = b"\x00\x00\x00\x00"
    part.write_bytes(bytes(bad))
    _assert_refused_untouched(p, part, bytes(bad))


def test_frame_length_not_whole_records_refused(tmp_path: Path) -> None:
    p = tmp_path / "t"
    part, data = _two_frame_part(p)
    off = _layout_offsets(data)["frame1 start"]
    bad = bytearray(data)
    struct.pack_into("<I", bad, off, 64 * DT.itemsize - 1)
    part.write_bytes(bytes(bad))
    _assert_refused_untouched(p, part, bytes(bad))


def test_corrupt_frame_body_refused(tmp_path: Path) -> None:
    p = tmp_path / "t"
    part, data = _two_frame_part(p)
    offs = _layout_offsets(data)
    mid = (offs["frame1 start"] + FH + offs["frame2 start"]) // 2
    bad = bytearray(data)
    bad[mid] ^= 0xFF
    part.write_bytes(bytes(bad))
    _assert_refused_untouched(p, part, bytes(bad))


# ---------------------------------------------------------------------- resume
def test_resume_raw_part_whose_parquet_part_exists(tmp_path: Path) -> None:
    chunks = [_events(50, 9), _events(70, 10, t0=3_000_000)]
    total = sum(len(c) for c in chunks)
    p = _raw_trace(tmp_path / "t", chunks)
    raw1 = (p / "ioctls" / rawparts.raw_part_name(1)).read_bytes()
    rawconvert.convert(p)
    parquet = {n: (p / "ioctls" / n).read_bytes() for n in _files(p)}
    (p / "ioctls" / rawparts.raw_part_name(1)).write_bytes(raw1)  # cut short before unlink
    done = rawconvert.convert(p)
    assert (done.parts, done.rows) == (0, 0)
    assert {n: (p / "ioctls" / n).read_bytes() for n in _files(p)} == parquet
    assert _manifest(p)["tables"]["ioctls"] == {"rows": total, "parts": 2}
    assert _table(p).height == total


def test_resume_after_first_part_renamed(tmp_path: Path) -> None:
    """Cut short after part 1's Parquet part was renamed into place, before its raw
    part was removed or the manifest rewritten."""
    chunks = [_events(50, 11), _events(70, 12, t0=3_000_000)]
    total = sum(len(c) for c in chunks)
    done_copy = _raw_trace(tmp_path / "c", chunks)
    rawconvert.convert(done_copy)
    p = _raw_trace(tmp_path / "t", chunks)
    first = (done_copy / "ioctls" / "part-000001.parquet").read_bytes()
    (p / "ioctls" / "part-000001.parquet").write_bytes(first)
    done = rawconvert.convert(p)
    assert (done.parts, done.rows) == (1, len(chunks[1]))
    assert _files(p) == ["part-000001.parquet", "part-000002.parquet"]
    assert _manifest(p)["tables"]["ioctls"] == {"rows": total, "parts": 2}
    assert _table(p).equals(_table(done_copy))


def test_resume_manifest_announcing_raw_parts_none_left(tmp_path: Path) -> None:
    chunks = [_events(40, 13), _events(33, 14, t0=8_000_000)]
    total = sum(len(c) for c in chunks)
    p = _raw_trace(tmp_path / "t", chunks)
    stale = _manifest(p)
    rawconvert.convert(p)
    (p / "manifest.json").write_text(json.dumps(stale))  # raw parts gone, manifest not yet
    assert stale["tables"]["ioctls"]["raw_parts"] == 2
    done = rawconvert.convert(p)
    assert done.tables == ["ioctls"]
    assert _manifest(p)["tables"]["ioctls"] == {"rows": total, "parts": 2}
    assert open_trace(p).rows("ioctls") == total


# ---------------------------------------------------------------- layout checks
def _hand_part(p: Path, meta: dict[str, Any], records: bytes) -> Path:
    """A trace whose ioctls table holds one hand-made raw part with header `meta`."""
    TraceWriter(p).close()
    (p / "ioctls").mkdir(mode=0o700)
    body = json.dumps(meta, sort_keys=True).encode()
    part = p / "ioctls" / rawparts.raw_part_name(1)
    part.write_bytes(rawparts.MAGIC + struct.pack("<I", len(body)) + body
                     + rawparts.frame(records))  # fmt: skip
    return part


def _meta(**over: Any) -> dict[str, Any]:
    meta = {"table": "ioctls", "record": RECORD, "itemsize": DT.itemsize,
            "fields": rawparts.layout(DT), "codec": rawparts.CODEC}  # fmt: skip
    meta.update(over)
    return meta


def _renamed_dtype() -> np.dtype[Any]:
    names = list(DT.names or ())
    names[names.index("h_class")] = "h_klass"
    return np.dtype({"names": names, "formats": [DT.fields[n][0] for n in DT.names or ()],
                     "offsets": [DT.fields[n][1] for n in DT.names or ()],
                     "itemsize": DT.itemsize})  # fmt: skip


@pytest.mark.parametrize(("over", "needle"), [
    ({"fields": "renamed"}, "another layout"),
    ({"itemsize": DT.itemsize + 8}, "another layout"),
    ({"record": "mapping_event"}, "does not decode"),
    ({"record": "no_such_record"}, "does not decode"),
    ({"table": "mappings"}, "does not decode"),
])  # fmt: skip
def test_other_layout_or_record_refused(tmp_path: Path, over: dict[str, Any],
                                        needle: str) -> None:  # fmt: skip
    if over.get("fields") == "renamed":
        over = {"fields": rawparts.layout(_renamed_dtype())}
    assert _meta(**over) != _meta()
    recs = _events(8, 15).tobytes()
    if "itemsize" in over:  # whole records of the size the header claims
        recs = bytes(8 * int(over["itemsize"]))
    p = tmp_path / "t"
    part = _hand_part(p, _meta(**over), recs)
    data = part.read_bytes()
    manifest = (p / "manifest.json").read_bytes()
    with pytest.raises(TraceError, match=needle) as e:
        rawconvert.convert(p)
    assert str(part) in str(e.value)
    assert part.read_bytes() == data
    assert _files(p) == [part.name]
    assert (p / "manifest.json").read_bytes() == manifest


def test_writer_built_part_of_other_layout_refused(tmp_path: Path) -> None:
    p = tmp_path / "t"
    w = TraceWriter(p)
    w.append_raw("ioctls", RECORD, _renamed_dtype(), _events(5, 16).tobytes())
    w.close()
    with pytest.raises(TraceError, match="another layout"):
        rawconvert.convert(p)
    assert _files(p) == [rawparts.raw_part_name(1)]


def test_hand_part_of_this_layout_converts(tmp_path: Path) -> None:
    """The hand-made header above is the writer's: the refusals are for the change."""
    ev = _events(8, 15)
    p = tmp_path / "t"
    _hand_part(p, _meta(), ev.tobytes())
    assert rawconvert.convert(p).rows == 8
    assert _table(p)["ts_ns"].to_list() == sorted(ev["ts_ns"].astype(int).tolist())


# ---------------------------------------------------------------------- locking
@pytest.mark.parametrize("who", ["convert", "writer --force"])
def test_refused_while_a_writer_is_open(tmp_path: Path, who: str) -> None:
    """A conversion or a second writer (--force) aimed at a trace being written is
    refused; once the first writer closed, a conversion goes through."""
    p = tmp_path / "t"
    w = TraceWriter(p)
    w.append_raw("ioctls", RECORD, DT, _events(20, 17).tobytes())
    w.rotate()
    with pytest.raises(TraceError, match="being written"):
        if who == "convert":
            rawconvert.convert(p)
        else:
            TraceWriter(p, force=True)
    assert _files(p) == [rawparts.raw_part_name(1)]
    w.close()
    assert rawconvert.convert(p).rows == 20


def test_second_writer_refusal_deletes_nothing(tmp_path: Path) -> None:
    p = tmp_path / "t"
    w = TraceWriter(p)
    w.append("ioctls", _decoded(_events(20, 19)))
    w.rotate()
    def tree() -> list[str]:
        return sorted(str(q.relative_to(p)) for q in p.rglob("*"))

    before = tree()
    assert "ioctls/part-000001.parquet" in before
    with pytest.raises(TraceError, match="being written"):
        TraceWriter(p, force=True)
    assert tree() == before


def test_force_over_raw_trace_leaves_no_stale_raw_parts(tmp_path: Path) -> None:
    p = _raw_trace(tmp_path / "t", [_events(10, 25), _events(10, 26, t0=5_000_000)])
    old = {n: (p / "ioctls" / n).read_bytes() for n in _files(p)}
    notes: list[str] = []
    try:
        w = TraceWriter(p, force=True, note=notes.append)
    except TraceError:  # refusing is fine, if it deleted nothing
        assert {n: (p / "ioctls" / n).read_bytes() for n in _files(p)} == old
        return
    w.append("ioctls", _decoded(_events(5, 27)))
    w.close()
    assert not list((p / "ioctls").glob(rawparts.RAW_GLOB)), notes
    assert open_trace(p).rows("ioctls") == 5


# -------------------------------------------------------------------- numbering
def test_numbering_parquet_raw_parquet(tmp_path: Path) -> None:
    c1, c2, c3 = _events(30, 20, t0=1_000), _events(40, 21, t0=1_000_000),\
        _events(50, 22, t0=10_000_000)  # fmt: skip
    p = tmp_path / "t"
    w = TraceWriter(p)
    w.append("ioctls", _decoded(c1))
    w.rotate()
    w.append_raw("ioctls", RECORD, DT, c2.tobytes())
    w.rotate()
    w.append("ioctls", _decoded(c3))
    w.rotate()
    w.close()
    assert _files(p) == ["part-000001.parquet", "part-000002.gtraw", "part-000003.parquet"]
    assert _manifest(p)["tables"]["ioctls"] == {"rows": 80, "parts": 2, "raw_parts": 1,
                                                "raw_records": 40}  # fmt: skip
    done = rawconvert.convert(p)
    assert (done.parts, done.rows) == (1, 40)
    t = open_trace(p)
    assert [q.name for q in t.parts("ioctls")] == [f"part-{i:06d}.parquet" for i in (1, 2, 3)]
    assert t.manifest["tables"]["ioctls"] == {"rows": 120, "parts": 3}
    in_part_order = t.scan("ioctls").collect()["ts_ns"].to_list()
    want = sorted(np.concatenate([c1, c2, c3])["ts_ns"].astype(int).tolist())
    assert in_part_order == want  # parts 1, 2, 3 in time order, no row lost


# ------------------------------------------------------------------------ CLI
def test_convert_nothing_to_convert(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "t"
    w = TraceWriter(p)
    w.append("ioctls", _decoded(_events(10, 23)))
    w.close()
    before = (p / "manifest.json").read_bytes()
    rc, out, err = _cli(capsys, "convert", str(p))
    assert rc == 0, err
    assert "nothing to convert" in out
    assert (p / "manifest.json").read_bytes() == before


def test_convert_missing_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _out, err = _cli(capsys, "convert", str(tmp_path / "nope"))
    assert rc != 0
    assert "no such trace directory" in _one_error_line(err)


@pytest.mark.parametrize("extra", [["--metrics", "9100"], ["--alert", "gpu_free<1GiB"],
                                   ["--live"]])  # fmt: skip
def test_record_raw_refuses_live_options(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         extra: list[str]) -> None:  # fmt: skip
    out_dir = tmp_path / "X"
    rc, _out, err = _cli(capsys, "record", "--raw", *extra, "-o", str(out_dir))
    assert rc == 2
    assert "--raw" in _one_error_line(err)
    assert not out_dir.exists()


# ------------------------------------------------------------------ append_raw
@pytest.mark.parametrize("cut", [1, DT.itemsize - 1, DT.itemsize + 1])
def test_append_raw_refuses_partial_records(tmp_path: Path, cut: int) -> None:
    data = _events(3, 24).tobytes()[:cut]
    w = TraceWriter(tmp_path / "t")
    with pytest.raises(TraceError, match="not whole"):
        w.append_raw("ioctls", RECORD, DT, data)
    w.close()
    assert not (tmp_path / "t" / "ioctls").exists()
    assert "ioctls" not in _manifest(tmp_path / "t")["tables"]


# ------------------------------------------------------------------------- jobs
def test_parts_converted_side_by_side_equal_one_at_a_time(tmp_path: Path) -> None:
    """`jobs` decodes parts side by side; the trace is the same part for part, and the
    manifest records them in order (synthetic: 5 raw parts of 40..80 records)."""
    chunks = [_events(40 + 10 * i, 40 + i, t0=1_000_000 * (i + 1)) for i in range(5)]
    one = _raw_trace(tmp_path / "one", chunks)
    many = _raw_trace(tmp_path / "many", chunks)
    a = rawconvert.convert(one, jobs=1)
    b = rawconvert.convert(many, jobs=3)
    assert (a.parts, a.rows) == (b.parts, b.rows) == (5, sum(len(c) for c in chunks))
    for i in range(1, 6):
        name = f"part-{i:06d}.parquet"
        ta = pq.read_table(one / "ioctls" / name)
        tb = pq.read_table(many / "ioctls" / name)
        assert ta.equals(tb) and ta.num_rows == len(chunks[i - 1]), name
    assert _manifest(many)["tables"]["ioctls"] == {"rows": b.rows, "parts": 5}


def test_convert_jobs_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = _raw_trace(tmp_path / "t", [_events(30, 50), _events(30, 51, t0=9_000_000)])
    rc, _out, err = _cli(capsys, "convert", str(p), "--jobs", "0")
    assert rc == 2 and "--jobs" in _one_error_line(err)
    assert len(list((p / "ioctls").glob(rawparts.RAW_GLOB))) == 2  # refused: nothing done
    rc, out, _err = _cli(capsys, "convert", str(p), "-j", "2")
    assert rc == 0 and "2 raw parts decoded into 60 rows of ioctls" in out
