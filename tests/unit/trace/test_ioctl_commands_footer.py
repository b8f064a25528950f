"""The `ioctls` parts' command set in their footers (`schema.IOCTL_COMMANDS`): written
by the decoder's batches through both part writers (the recorder's and `gputrace
convert`'s), read back as the union over parts, unknown as soon as one batch or part
lacks it, and giving the ioctl summary the same answer as scanning the names."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest
from polars.testing import assert_frame_equal

from gputrace import schema
from gputrace.analyses.helpers.inputs import inputs_from_trace
from gputrace.analyses.summary import _by_names, ioctl_stats
from gputrace.importers import raw as rawconvert
from gputrace.trace.reader import open_trace
from gputrace.trace.writer import TraceWriter
from tests.unit.trace.test_raw_parts import _decoded, _events, _raw_trace

PS = schema.IOCTL_COMMANDS
KEY = PS.key.encode()


def _distinct(df: pl.DataFrame) -> list[tuple[object, ...]]:
    """The rows' (device_code, nr, device, name), each once, as the footer sorts them."""
    rows = df.select(PS.columns).unique().rows()
    return sorted({tuple(r) for r in rows}, key=repr)


def _footer(path: Path) -> list[tuple[object, ...]] | None:
    return PS.decode((pq.read_metadata(path).metadata or {}).get(KEY))


def test_decoded_batch_carries_its_commands() -> None:
    batch = _decoded(_events(600, 1))
    got = PS.decode((batch.schema.metadata or {}).get(KEY))
    rows = pl.from_arrow(batch)
    assert isinstance(rows, pl.DataFrame)
    assert got == _distinct(rows)
    assert got is not None and len(got) == 9  # 3 RM escapes x (ctl, gpu) + 3 UVM numbers


def test_parts_hold_the_union_of_their_batches(tmp_path: Path) -> None:
    p = tmp_path / "t"
    w = TraceWriter(p)
    w.append("ioctls", _decoded(_events(300, 1, devices=(1,))))  # one part, two batches
    w.append("ioctls", _decoded(_events(300, 2, devices=(3,))))
    w.rotate()
    w.append("ioctls", _decoded(_events(300, 3, devices=(2,))))
    w.close()
    tr = open_trace(p)
    parts = tr.parts("ioctls")
    assert len(parts) == 2
    for part in parts:
        assert _footer(part) == _distinct(pl.read_parquet(part))
    rows = tr.scan("ioctls").collect()
    assert tr.part_set("ioctls", PS.key) == _distinct(rows)
    assert {d for d, *_ in _distinct(rows)} == {1, 2, 3}
    commands = inputs_from_trace(tr).ioctl_commands
    assert commands is not None
    assert sorted(commands.rows(), key=repr) == _distinct(rows)
    assert commands.schema == pl.Schema({c: rows.schema[c] for c in PS.columns})


def test_a_batch_without_the_set_makes_its_part_unknown(tmp_path: Path) -> None:
    p = tmp_path / "t"
    w = TraceWriter(p)
    w.append("ioctls", _decoded(_events(200, 1)))
    w.rotate()
    w.append("ioctls", _decoded(_events(200, 2)))
    w.append("ioctls", _decoded(_events(200, 3)).replace_schema_metadata(None))
    w.close()
    tr = open_trace(p)
    first, second = tr.parts("ioctls")
    assert _footer(first) is not None
    assert KEY not in (pq.read_metadata(second).metadata or {})
    assert tr.part_set("ioctls", PS.key) is None
    assert inputs_from_trace(tr).ioctl_commands is None
    assert tr.part_set("ioctls", "gputrace.no_such_set") is None
    assert tr.part_set("faults", PS.key) is None  # a table without it, and no parts


def test_convert_writes_the_set(tmp_path: Path) -> None:
    b = _raw_trace(tmp_path / "raw", [_events(300, 1, devices=(1, 3)), _events(200, 2)])
    rawconvert.convert(b)
    tr = open_trace(b)
    for part in tr.parts("ioctls"):
        assert _footer(part) == _distinct(pl.read_parquet(part))
    assert tr.part_set("ioctls", PS.key) == _distinct(tr.scan("ioctls").collect())


@pytest.mark.parametrize("value", [
    b"not json", b"\xff\xfe", b"{}", b"[[1, 2, 3]]", b"[[1, 2, \"ctl\", true]]",
    b"[[1, 2, \"ctl\", null]]", b"[[1, 2, \"ctl\", 1.5]]", b"[1]",
])  # fmt: skip
def test_a_damaged_footer_value_is_unknown(value: bytes) -> None:
    assert PS.decode(value) is None
    assert PS.union([PS.encode([(1, 2, "ctl", "RM_X")]), value]) is None


def test_summary_from_the_footer_equals_the_scanned_one(tmp_path: Path) -> None:
    p = tmp_path / "t"
    w = TraceWriter(p)
    for seed in range(4):
        w.append("ioctls", _decoded(_events(2_000, seed)))
        w.rotate()
    w.close()
    inp = inputs_from_trace(open_trace(p))
    assert inp.ioctl_commands is not None
    scanned = ioctl_stats(inp.scan("ioctls")).collect()
    assert scanned.height == 3 + 3 * 8 + 3  # RM on ctl; RM on gpu, per GPU; UVM
    assert_frame_equal(ioctl_stats(inp.scan("ioctls"), inp.ioctl_commands).collect(), scanned)
    assert_frame_equal(_by_names(inp.scan("ioctls")).collect(), scanned)  # no packing at all
    # a superset (the footers of a table since filtered, say) gives the same answer
    extra = pl.DataFrame([(1, 0x99, "ctl", "NV_ESC_0x99")], schema=inp.ioctl_commands.schema,
                         orient="row")
    wider = pl.concat([inp.ioctl_commands, extra])
    assert_frame_equal(ioctl_stats(inp.scan("ioctls"), wider).collect(), scanned)
    # a filtered table with the whole table's set
    some = inp.scan("ioctls").filter(pl.col("pid") == 100)
    assert_frame_equal(ioctl_stats(some, inp.ioctl_commands).collect(),
                       ioctl_stats(some).collect())


def test_an_impossible_code_in_the_footer_leaves_the_names_path(tmp_path: Path) -> None:
    """A footer naming a device code past UInt8 reads as null: the packed path is refused
    and the names path answers (still right)."""
    p = tmp_path / "t"
    w = TraceWriter(p)
    batch = _decoded(_events(500, 1))
    meta = dict(batch.schema.metadata or {})
    rows = PS.decode(meta[KEY])
    assert rows is not None
    meta[KEY] = PS.encode([*rows, (300, 1, "ctl", "RM_X")])
    w.append("ioctls", batch.replace_schema_metadata(meta))
    w.close()
    inp = inputs_from_trace(open_trace(p))
    assert inp.ioctl_commands is not None
    assert inp.ioctl_commands["device_code"].null_count() == 1
    assert_frame_equal(ioctl_stats(inp.scan("ioctls"), inp.ioctl_commands).collect(),
                       ioctl_stats(inp.scan("ioctls")).collect())
    assert ioctl_stats(inp.scan("ioctls"), inp.ioctl_commands).collect()["count"].sum() == 500
