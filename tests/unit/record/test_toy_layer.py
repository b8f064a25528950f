"""A recorder layer is a plug-in: a toy layer (its probe source with its own small event
header, its numpy mirror, its decoder, its `Layer` and its table's `Catalog`), registered
here the way a real one is (its catalog added to the schema, its class in
`RECORDER_LAYERS`), is in `gputrace doctor`'s recordable layers, in the schema docs, in a
trace's manifest and in `gputrace info`, and its rows are read back, with no edit
anywhere else. The toy and its rows are SYNTHETIC."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pytest

from gputrace import cli, schema
from gputrace.commands import doctor
from gputrace.record import layers
from gputrace.record.layer import Buffer, Decoded, Layer
from gputrace.record.recorder import Options
from gputrace.record.session import Session, merged
from gputrace.record.structs import Mirror
from gputrace.schema.markdown import render_markdown
from gputrace.schema.model import I32, I64, U32, Catalog, Column, Table
from gputrace.trace.reader import open_trace
from gputrace.trace.writer import TraceWriter
from tests.unit.record.test_event_structs import _c_layout, _disagreements

TOY_HEADER = """\
/* The toy layer's event: one per toy a process brings (a test's probe source). */
#ifndef TOY_EVENTS_H
#define TOY_EVENTS_H
#ifdef GT_USERSPACE
#include <stdint.h>
typedef uint32_t u32;
typedef int32_t s32;
typedef uint64_t u64;
#endif
struct toy_event {
    u64 ts_ns;
    s32 pid;
    u32 toys;
};
#endif
"""

TOY_PROBE = """\
#include "toy_events.h"
BPF_RINGBUF_OUTPUT(toy_events, 8);
int toy_probe(struct pt_regs *ctx) {
    struct toy_event ev = {.ts_ns = bpf_ktime_get_ns(), .pid = bpf_get_current_pid_tgid() >> 32,
                           .toys = 1};
    toy_events.ringbuf_output(&ev, sizeof(ev), 0);
    return 0;
}
"""
"""The toy's BPF program (its loader glue would hand it to bcc; no BPF runs here)."""

TOY_DTYPE = np.dtype([("ts_ns", "<u8"), ("pid", "<i4"), ("toys", "<u4")])
"""The numpy mirror of struct toy_event."""

TOYS = Table("toys", "Toys a process brought (a test's layer).", "toy", (
    Column("ts_ns", I64, "ns", "when", False),
    Column("pid", I32, "", "process", False),
    Column("toys", U32, "", "how many", False),
))
TOY_CATALOG = Catalog(("toy",), (TOYS,))


def _toys(layer: Any, s: Session, kind: str, data: Any) -> Decoded:
    ev = np.frombuffer(data, TOY_DTYPE)
    cols = [pa.array(ev["ts_ns"].astype(np.int64)), pa.array(ev["pid"]), pa.array(ev["toys"])]
    return pa.RecordBatch.from_arrays(cols, schema=TOYS.arrow_schema), 0


class ToyLayer(Layer):
    """The toy recorder layer: one buffer, one table, the default manifest fragment."""

    name = "toy"
    RECORDS: ClassVar[dict[str, tuple[str, ...]]] = {"toy": ("uprobes",)}
    BUFFERS: ClassVar[dict[str, Buffer]] = {
        "toy_events": Buffer("toys", "toy_events", TOY_DTYPE, _toys)}


@pytest.fixture
def plugged(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The toy registered as a real layer is (its catalog line, its registration line),
    and taken back after the test."""
    schema.add(TOY_CATALOG)
    monkeypatch.setattr(layers, "RECORDER_LAYERS", (*layers.RECORDER_LAYERS, ToyLayer))
    try:
        yield
    finally:
        schema.remove(TOY_CATALOG)


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not installed")
def test_the_toy_header_and_its_mirror_agree(tmp_path: Path) -> None:
    """The probe source's header is the one source of the record: compiled, its layout is
    the mirror's (as for every real layer's header), and a wrong mirror is caught."""
    header = tmp_path / "toy_events.h"
    header.write_text(TOY_HEADER)
    (tmp_path / "toy.bpf.c").write_text(TOY_PROBE)
    mirror = Mirror("toy_events.h", "toy_event", TOY_DTYPE)
    c = _c_layout(tmp_path, header, [mirror])
    assert _disagreements(c, [mirror]) == []
    wrong = Mirror("toy_events.h", "toy_event",
                   np.dtype([("ts_ns", "<u8"), ("toys", "<u4"), ("pid", "<i4")]))
    assert _disagreements(c, [wrong])


def test_doctor_lists_the_toy(plugged: None) -> None:
    ok = [doctor.Check(k, doctor.OK, "") for k in (*doctor.REQUIRED, "uprobes")]
    assert doctor.layers(ok)[-1] == "toy"
    assert "toy" not in doctor.layers([c for c in ok if c.key != "uprobes"])


def test_without_registration_the_toy_is_nowhere() -> None:
    ok = [doctor.Check(k, doctor.OK, "") for k in (*doctor.REQUIRED, "uprobes")]
    assert "toy" not in doctor.layers(ok)
    assert "toys" not in schema.TABLES and "toy" not in schema.LAYERS
    assert "`toys`" not in render_markdown()


def test_schema_docs_and_guards_take_the_toy(plugged: None) -> None:
    assert schema.LAYERS["toy"] == ("toys",)
    doc = render_markdown()
    assert "| `toy` | `toys` |" in doc and "Toys a process brought" in doc
    from tests.unit.record.test_layer_guards import layer_problems

    assert layer_problems(layers.RECORDER_LAYERS) == []
    assert layers.buffer_table()["toy_events"] == (ToyLayer, ToyLayer.BUFFERS["toy_events"])


def test_a_toy_recording_holds_its_rows_in_the_manifest_and_info(
        plugged: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The writer thread's path (decode, append, the layer's manifest fragment, close) on
    the toy's records: the manifest lists the toy layer and its table, `info` shows both,
    the reader gives the rows back."""
    out = tmp_path / "t"
    s = Session(Options(output=str(out)), "/dev/", None, [], [], 0)  # type: ignore[arg-type]
    s.note_pids = lambda pids, ts=None: None  # type: ignore[method-assign]  # no /proc reads
    s.writer = TraceWriter(out, manifest={"start_ts_ns": 1, "end_ts_ns": 10})
    layer = ToyLayer()
    ev = np.zeros(3, TOY_DTYPE)
    ev["ts_ns"], ev["pid"], ev["toys"] = [2, 3, 4], [41, 41, 42], [1, 2, 4]
    kind, buf = "toy_events", ToyLayer.BUFFERS["toy_events"]
    s.decode(layer, buf, kind, ev.tobytes())
    s.w.update_manifest(**merged(s.w.manifest, layer.manifest(s, s.w.manifest)))
    s.w.close()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["layers"] == ["toy"] and manifest["tables"]["toys"]["rows"] == 3
    rows = open_trace(out).scan("toys").collect()
    assert rows["toys"].to_list() == [1, 2, 4] and rows["pid"].to_list() == [41, 41, 42]
    assert cli.main(["info", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["layers"] == ["toy"] and info["rows"]["toys"] == 3
    assert cli.main(["info", str(out)]) == 0
    assert "layers     toy" in capsys.readouterr().out
