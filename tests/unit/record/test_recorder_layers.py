"""The recorder layer protocol without BPF: one registration table, manifest
fragments merged, live observers isolated, stats counted (rows are synthetic)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from gputrace import schema
from gputrace.record import layers
from gputrace.record.layers import RECORDER_LAYERS, buffer_table
from gputrace.record.recorder import Options, Recorder
from gputrace.record.session import Session, merged


class Sink:
    """A TraceWriter stand-in that keeps what is appended."""

    def __init__(self) -> None:
        self.tables: dict[str, list[pa.Table | pa.RecordBatch]] = {}
        self.manifest: dict[str, Any] = {"drops": {"a": 1}}

    def append(self, table: str, data: pa.RecordBatch | pa.Table) -> None:
        self.tables.setdefault(table, []).append(data)

    def update_manifest(self, **fields: Any) -> None:
        self.manifest.update(fields)


def _session() -> tuple[Session, Sink]:
    s = Session(Options(output="unused"), "/dev/", None, [], [], 0)  # type: ignore[arg-type]
    sink = Sink()
    s.writer = sink  # type: ignore[assignment]
    return s, sink


def _files(n: int) -> pa.Table:
    return pa.Table.from_pylist([{"ts_ns": i, "pid": 1} for i in range(n)],
                                schema=schema.FILES.arrow_schema)  # fmt: skip


def test_one_table_routes_every_kind_to_one_layer() -> None:
    table = buffer_table()
    assert {k for cls in RECORDER_LAYERS for k in cls.BUFFERS} == set(table)
    assert table["ioctl_events"][1].table == "ioctls"
    assert table["fault_leftover"][1].counted_as == "fault_events"
    assert table["api:cuda_calls"][1].table == "cuda_calls"
    assert [b.last for _, b in table.values()].count(True) == 1  # process exits go last
    order = [cls.name for cls in RECORDER_LAYERS]
    # the orders the recorder relies on (layers.py's docstring); a new layer anywhere else
    # changes none of them
    assert order[0] == "syscall"
    assert order.index("torch_allocator") < order.index("api") < order.index("driver")
    assert order.index("syscall") < order.index("cpu_faults")
    assert layers.Layer().drain(None, layers.Due.POLL) == []  # type: ignore[arg-type]


def test_manifest_fragments_join_layers_and_add_to_drops() -> None:
    m = {"layers": ["syscall"], "drops": {"a": 1}, "gpus": [1]}
    out = merged(m, {"layers": ["syscall", "uvm_tools"], "drops": {"b": 2}, "gpus": [2]})
    assert out == {"layers": ["syscall", "uvm_tools"], "drops": {"a": 1, "b": 2}, "gpus": [2]}


def test_observers_see_each_appended_table_and_never_end_the_recording(
        capsys: pytest.CaptureFixture[str]) -> None:
    s, sink = _session()
    seen: list[tuple[str, int]] = []

    def bad(_name: str, _t: pa.Table) -> None:
        raise ValueError("observer bug")

    s.observers += [lambda name, t: seen.append((name, t.num_rows)), bad]
    s.append("files", _files(3))
    s.append("files", pa.RecordBatch.from_pylist([{"ts_ns": 9, "pid": 2}],
                                                 schema=schema.FILES.arrow_schema))
    assert seen == [("files", 3), ("files", 1)]  # batches arrive as tables
    assert len(sink.tables["files"]) == 2
    st = s.stats()
    assert st.rows == {"files": 4} and st.observer_errors == 2
    assert capsys.readouterr().err.count("live observer raised ValueError") == 1
    assert st.drops == {"a": 1} and st.cpu_s > 0 and st.rss_bytes > 1 << 20


def test_decoder_errors_and_skips_count_in_stats() -> None:
    s, _ = _session()
    buf = layers.Buffer("files", "fd_events", np.dtype("u8"), lambda *_: (_files(2), 3))
    s.note_pids = lambda pids, ts=None: None  # type: ignore[method-assign]  # no /proc reads
    s.decode(None, buf, "fd_events", b"")
    assert s.stats().decode_errors == {"fd_events": 3} and s.stats().rows == {"files": 2}


def test_recorder_stats_before_a_recording_and_observer_registration() -> None:
    r = Recorder(Options(output="unused"))
    assert r.stats().rows == {} and r.stats().cpu_s == 0.0
    r.add_observer(lambda name, t: None)
    assert len(r._observers) == 1
