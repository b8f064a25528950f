"""A decoder that meets records it cannot read skips and counts them; it never
raises and never loses the good records around them (hypothesis, bounded).

The records here are synthetic: numpy records shaped like the C structs, with
random field values, some then damaged (an unknown code, a cut-short record, a
batch count past its bytes) or replaced by random bytes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gputrace import schema
from gputrace.record import decode, hooks, loader
from gputrace.record.api import libcuda as cuda
from gputrace.record.api.layer import ApiLayer
from gputrace.record.cpu_faults import decode as decode_faults
from gputrace.record.cpu_faults import managed_ranges as cpufaults
from gputrace.record.cpu_faults.layer import CpuFaultsLayer
from gputrace.record.layers import buffer_table
from gputrace.record.recorder import PID_MAX, Options
from gputrace.record.session import Session
from gputrace.record.syscall.layer import SyscallLayer
from gputrace.record.torch_allocator import layer as torch_layer

FUZZ = settings(max_examples=200, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])  # fmt: skip

OFFLINE = (SyscallLayer, CpuFaultsLayer, ApiLayer)
"""The layers this test builds without BPF (`Offline`); their buffers are fuzzed."""
KINDS = {kind: buf.dtype for kind, (cls, buf) in buffer_table().items() if cls in OFFLINE}
"""Each fuzzed work item kind and its record, as its layer registered it."""
BUFFER = {kind: buf.counted_as for kind, (_, buf) in buffer_table().items()}
"""Each kind's `decode_errors` key."""
TABLE = {kind: buf.table for kind, (_, buf) in buffer_table().items()}
# fields holding codes the decoders name, and the codes they know
CODES: dict[str, dict[str, list[int]]] = {
    "ioctl_events": {"device": list(schema.DEVICE_KINDS)},
    "mapping_events": {"op": list(schema.MAPPING_OPS), "device": list(schema.DEVICE_KINDS)},
    "fd_events": {"op": list(schema.FD_OPS), "device": list(schema.DEVICE_KINDS)},
    "fault_events": {},
    "proc_events": {"kind": [decode.PROC_EXEC, decode.PROC_EXIT, decode.PROC_SEEN,
                             decode.PROC_UVM_INIT]},
    "api:cuda_calls": {"func": sorted(hooks.cuda_symbols().values())},
}
STAGE = {"leftover": decode.STAGE_EVENTS, "fault_leftover": decode_faults.FAULT_STAGE_EVENTS}


def codes_of(kind: str) -> dict[str, list[int]]:
    return CODES[kind] if kind in CODES else CODES[BUFFER[kind]]


class Sink:
    """A TraceWriter stand-in that keeps what is appended."""

    def __init__(self) -> None:
        self.rows: dict[str, int] = {}
        self.manifest: dict[str, Any] = {}

    def append(self, table: str, data: pa.RecordBatch | pa.Table) -> None:
        assert data.schema.names == [c.name for c in schema.table(table).columns]
        self.rows[table] = self.rows.get(table, 0) + data.num_rows

    def update_manifest(self, **fields: Any) -> None:
        self.manifest.update(fields)


class Offline:
    """The writer-thread side of a recording, without BPF: each kind goes to the
    decoder its layer registered (gputrace.record.layers)."""

    def __init__(self) -> None:
        self.s = Session(Options(output="unused"), "/dev/", None, [], [], 0)  # type: ignore[arg-type]
        self.s.note_pids = lambda pids, ts=None: None  # type: ignore[method-assign]  # no /proc reads
        api = cuda.LibcudaProbes.__new__(cuda.LibcudaProbes)  # no BPF: only its decoder is used
        api.names = {v: k for k, v in hooks.cuda_symbols().items()}
        self.layers = {SyscallLayer: SyscallLayer(), CpuFaultsLayer: CpuFaultsLayer(),
                       ApiLayer: ApiLayer(api)}  # fmt: skip
        self.table = buffer_table()
        self.s.decode_errors = {b.counted_as: 0 for _, b in self.table.values()}

    @property
    def decode_errors(self) -> dict[str, int]:
        return self.s.decode_errors

    def _handle(self, kind: str, data: bytes, sink: Sink) -> None:
        self.s.writer = sink  # type: ignore[assignment]
        cls, buf = self.table[kind]
        self.s.decode(self.layers[cls], buf, kind, data)

    def _finish_processes(self, sink: Sink) -> None:
        self.s.writer = sink  # type: ignore[assignment]
        self.s.finish_processes()


def recorder() -> Offline:
    return Offline()


def valid(kind: str, n: int, seed: int) -> np.ndarray[Any, Any]:
    """n records with random values and known codes (pids of processes unseen)."""
    rng = np.random.default_rng(seed)
    dtype = KINDS[kind]
    ev = np.frombuffer(rng.bytes(n * dtype.itemsize), dtype).copy()
    ev["ts_ns"] = np.sort(rng.integers(0, 1 << 62, n, dtype=np.uint64))
    ev["pid"] = rng.integers(1, PID_MAX, n)
    if "tid" in ev.dtype.names:  # type: ignore[operator]
        ev["tid"] = ev["pid"]
    if "ppid" in ev.dtype.names:  # type: ignore[operator]
        ev["ppid"] = rng.integers(1, PID_MAX, n)
    for field, codes in codes_of(kind).items():
        ev[field] = rng.choice(codes, n)
    return ev


def raw_of(kind: str, ev: np.ndarray[Any, Any]) -> bytes:
    """The bytes the recorder hands the writer thread for `kind`."""
    if kind not in STAGE:
        return ev.tobytes()
    out, stage = [], STAGE[kind]
    for i in range(0, len(ev), stage):
        chunk = ev[i : i + stage]
        out.append(len(chunk).to_bytes(4, "little") + bytes(4) + chunk.tobytes())
    return b"".join(out)


def handle(kind: str, data: bytes) -> tuple[Offline, Sink]:
    r, sink = recorder(), Sink()
    r._handle(kind, data, sink)
    r._finish_processes(sink)
    return r, sink


@FUZZ
@given(kind=st.sampled_from(sorted(KINDS)), data=st.binary(max_size=4096))
def test_random_bytes_never_raise(kind: str, data: bytes) -> None:
    r, sink = handle(kind, data)
    if kind != "proc_events":  # proc rows are one per process, not per record
        whole = len(data) // KINDS[kind].itemsize
        rows = sink.rows.get(TABLE[kind], 0)
        assert rows <= whole
        assert rows + r.decode_errors[BUFFER.get(kind, kind)] >= (0 if kind in STAGE else whole)


@FUZZ
@given(kind=st.sampled_from(sorted(KINDS)), n=st.integers(1, 150), seed=st.integers(0, 2**32),
       damage=st.lists(st.integers(0, 10**6), max_size=5), cut=st.integers(0, 200))  # fmt: skip
def test_damaged_records_are_counted_the_rest_kept(
    kind: str, n: int, seed: int, damage: list[int], cut: int
) -> None:
    """Unknown codes in some records, and a partial record at the end: exactly those
    are skipped and counted; every other record becomes a row."""
    ev = valid(kind, n, seed)
    codes = codes_of(kind)
    bad: list[int] = []
    for field, known in list(codes.items())[:1]:
        bad = sorted({d % n for d in damage})
        for i in bad:
            ev[field][i] = max(known) + 1 + (i % 7)  # no decoder knows it
    data = raw_of(kind, ev)
    tail = cut % KINDS[kind].itemsize if kind not in STAGE else 0
    data += bytes(tail)
    r, sink = handle(kind, data)
    buffer = BUFFER.get(kind, kind)
    assert r.decode_errors[buffer] == len(bad) + (1 if tail else 0)
    if kind == "proc_events":
        good = ev[np.isin(np.arange(n), bad, invert=True)]
        assert sink.rows.get("processes", 0) == len(np.unique(good["pid"]))
    else:
        assert sink.rows.get(TABLE[kind], 0) == n - len(bad)


@FUZZ
@given(kind=st.sampled_from(sorted(STAGE)), n=st.integers(1, 300), seed=st.integers(0, 2**32),
       which=st.integers(0, 10), count=st.integers(0, 2**32 - 1))  # fmt: skip
def test_batch_count_past_the_bytes(kind: str, n: int, seed: int, which: int,
                                    count: int) -> None:  # fmt: skip
    """A batch whose count cannot be right ends the read there: the batches before
    it are kept, the rest counted (at least 1), nothing raises."""
    ev = valid(kind, n, seed)
    data = bytearray(raw_of(kind, ev))
    stage, size = STAGE[kind], KINDS[kind].itemsize
    batches = (n + stage - 1) // stage
    b = which % batches
    pos = b * (8 + stage * size)  # every batch before the last one is full
    real = min(stage, n - b * stage)
    if count == real:
        count = stage + 1  # past the stage: never a count the probe writes
    data[pos : pos + 4] = count.to_bytes(4, "little")
    r, sink = handle(kind, bytes(data))
    kept = sink.rows.get(TABLE[kind], 0)
    buffer = BUFFER[kind]
    if count <= stage and pos + 8 + count * size <= len(data):
        # a count that fits reads other bytes as records: nothing can tell, no error needed
        return
    assert kept == b * stage
    assert r.decode_errors[buffer] >= 1


def test_decoder_bug_costs_the_chunk_not_the_recording(monkeypatch: Any) -> None:
    """A decoder that raises: its chunk is counted as skipped, the next one is kept."""
    ev = valid("mapping_events", 10, 1)
    calls = {"n": 0}
    real = decode.mappings_batch

    def flaky(e: Any) -> pa.RecordBatch:
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyError(99)
        return real(e)

    monkeypatch.setattr(decode, "mappings_batch", flaky)
    r, sink = recorder(), Sink()
    r._handle("mapping_events", ev.tobytes(), sink)
    r._handle("mapping_events", ev.tobytes(), sink)
    assert r.decode_errors["mapping_events"] == 10
    assert sink.rows["mappings"] == 10


def test_known_and_records_building_blocks() -> None:
    ev = valid("fd_events", 5, 3)
    ev["device"][2] = 200
    kept, bad = decode.known(ev, {"device": schema.DEVICE_KINDS})
    assert bad == 1 and len(kept) == 4 and 200 not in kept["device"]
    got, cut = decode.records(ev.tobytes() + b"\0", decode.FD_DTYPE)
    assert cut == 1 and len(got) == 5
    faults = valid("fault_events", 3, 4)
    batch, skipped = cpufaults.decode_batch("fault_events", faults.tobytes())
    assert skipped == 0 and batch is not None and batch.num_rows == 3
    assert loader.BUFFERS  # every buffer has a decode_errors key
    errors = set(recorder().decode_errors)
    assert errors == {b.counted_as for _, b in buffer_table().values()}
    assert {*loader.BUFFERS, cuda.BUFFER, torch_layer.BUFFER} <= errors


@FUZZ
@given(kind=st.sampled_from(sorted(KINDS)), n=st.integers(1, 100), seed=st.integers(0, 2**32),
       flips=st.lists(st.tuples(st.integers(0, 10**7), st.integers(0, 255)), max_size=40))
def test_mutated_records_never_raise(kind: str, n: int, seed: int,
                                     flips: list[tuple[int, int]]) -> None:  # fmt: skip
    """Valid records with random bytes overwritten anywhere (codes, counts, pids,
    times): nothing raises, and no more rows come out than records went in."""
    data = bytearray(raw_of(kind, valid(kind, n, seed)))
    for pos, byte in flips:
        data[pos % len(data)] = byte
    r, sink = handle(kind, bytes(data))
    if kind not in ("proc_events", *STAGE):
        assert sink.rows.get(TABLE[kind], 0) + r.decode_errors[BUFFER.get(kind, kind)] == n
    else:  # one row per process, or per record read out of the batches' bytes
        assert sink.rows.get(TABLE[kind], 0) <= len(data) // KINDS[kind].itemsize


def test_process_events_with_impossible_fields_are_skipped() -> None:
    """pids past PID_MAX (int32 columns) or times past int64: skipped, counted."""
    ev = valid("proc_events", 4, 7)
    ev["kind"] = decode.PROC_EXIT
    ev["pid"][0] = 0xFFFFFFFF
    ev["ppid"][1] = 0x80000000
    ev["ts_ns"][2] = 1 << 63
    r, sink = handle("proc_events", ev.tobytes())
    assert r.decode_errors["proc_events"] == 3
    assert sink.rows["processes"] == 1
