"""Decoder edge cases that mutation testing found unasserted (docs/testing.md).

Answers: are count-prefixed batches cut exactly where they can no longer be
trusted, with the skipped records counted exactly; are unknown codes dropped and
counted; are comm names right when they are not UTF-8, fill all 16 bytes, or
differ within a batch; are out-of-order events sorted (stably); are 64-bit
values carried exactly? All records here are synthetic, built field by field.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from gputrace.record import decode
from gputrace.record.api import decode as decode_cuda
from gputrace.record.cpu_faults import decode as decode_faults
from gputrace.record.decode import BATCH_HEADER, batched, known, records

DT = decode_faults.FAULT_DTYPE  # any event dtype will do for the batch framing


def _events(n: int, first: int = 0) -> np.ndarray[Any, Any]:
    ev = np.zeros(n, DT)
    ev["ts_ns"] = np.arange(first, first + n) + 1000
    ev["address"] = (np.arange(first, first + n) + 1) << 12
    return ev


def _batch(ev: np.ndarray[Any, Any], count: int | None = None, pad: int = 0) -> bytes:
    c = len(ev) if count is None else count
    return c.to_bytes(4, "little") + pad.to_bytes(4, "little") + ev.tobytes()


# ------------------------------------------------------------------------ batched
def test_batched_empty_input() -> None:
    out, bad = batched(b"", DT, 4)
    assert (len(out), out.dtype, bad) == (0, DT, 0)


def test_batched_whole_batches_with_nonzero_padding() -> None:
    # the header's second word is padding: its bytes must not reach the count
    raw = _batch(_events(2), pad=0xFFFFFFFF) + _batch(_events(4, 2), pad=0x01010101)
    out, bad = batched(raw, DT, 4)  # a batch of exactly max_count is whole
    assert bad == 0
    assert out.tobytes() == _events(6).tobytes()


def test_batched_trailing_empty_batch() -> None:
    raw = _batch(_events(3)) + _batch(_events(0))
    out, bad = batched(raw, DT, 4)
    assert (len(out), bad) == (3, 0)


def test_batched_count_over_max_with_the_bytes_present() -> None:
    raw = _batch(_events(1)) + _batch(_events(3, 1))
    out, bad = batched(raw, DT, 2)
    assert out.tobytes() == _events(1).tobytes()
    assert bad == 3 and isinstance(bad, int)


@pytest.mark.parametrize(
    ("events_left", "extra", "want_bad"),
    [(0, 0, 1), (1, 0, 1), (2, 0, 2), (2, 5, 2), (3, DT.itemsize - 1, 3)],
)
def test_batched_count_past_the_bytes(events_left: int, extra: int, want_bad: int) -> None:
    good = _batch(_events(2))
    raw = good + _batch(_events(events_left, 2), count=9) + b"\x07" * extra
    out, bad = batched(raw, DT, 64)
    assert out.tobytes() == _events(2).tobytes()
    assert bad == want_bad and isinstance(bad, int)


@pytest.mark.parametrize("cut", [1, 4, BATCH_HEADER - 1])
def test_batched_header_cut_short(cut: int) -> None:
    raw = _batch(_events(2)) + _batch(_events(1))[:cut]
    out, bad = batched(raw, DT, 64)
    assert (out.tobytes(), bad) == (_events(2).tobytes(), 1)


def test_batched_only_a_bad_batch() -> None:
    out, bad = batched(_batch(_events(0), count=5), DT, 64)
    assert (len(out), out.dtype, bad) == (0, DT, 1)


# ------------------------------------------------------------------ records/known
@pytest.mark.parametrize(("extra", "skipped"), [(0, 0), (1, 1), (2, 1), (DT.itemsize - 1, 1)])
def test_records_partial_tail(extra: int, skipped: int) -> None:
    out, bad = records(_events(3).tobytes() + b"\x01" * extra, DT)
    assert (out.tobytes(), bad) == (_events(3).tobytes(), skipped)


def test_fault_events_from_bodies() -> None:
    ev = _events(3)
    ev["error_code"] = [0, 2, 6]
    out = decode_faults.fault_events(ev.tobytes() + b"\x00" * 5)
    assert out.dtype == DT
    assert out.tobytes() == ev.tobytes()
    assert decode_faults.fault_events(b"").dtype == DT


def test_known_keeps_only_known_codes_in_every_field() -> None:
    ev = np.zeros(6, decode.PROC_DTYPE)
    ev["kind"] = [1, 2, 9, 3, 1, 0]
    ev["exit_code"] = [0, 7, 0, 0, 5, 0]
    ev["pid"] = np.arange(6) + 100
    codes = {"kind": {1: "fork", 2: "exec", 3: "exit"}, "exit_code": {0: "ok", 7: "x"}}
    out, bad = known(ev, codes)
    assert bad == 3  # kind 9, kind 0 and exit_code 5
    assert out["pid"].tolist() == [100, 101, 103]
    assert isinstance(bad, int)


def test_known_all_known_and_empty() -> None:
    ev = np.zeros(3, decode.PROC_DTYPE)
    ev["kind"] = [1, 2, 1]
    out, bad = known(ev, {"kind": {1: "a", 2: "b"}})
    assert (bad, out.tobytes()) == (0, ev.tobytes())
    out, bad = known(ev, {})
    assert (bad, len(out)) == (0, 3)
    out, bad = known(ev[:0], {"kind": {1: "a"}})
    assert (bad, len(out)) == (0, 0)


def test_known_large_codes() -> None:
    ev = np.zeros(2, decode.IOCTL_DTYPE)
    ev["nr"] = [0x30000001, 0x30000003]
    out, bad = known(ev, {"nr": {0x30000001: "UVM_INITIALIZE"}})
    assert (bad, out["nr"].tolist()) == (1, [0x30000001])


# --------------------------------------------------------------------------- comm
def _comm_col(names: list[bytes]) -> list[str]:
    ev = np.zeros(len(names), DT)
    ev["ts_ns"] = np.arange(len(names))
    ev["comm"] = names
    col = decode_faults.faults_batch(ev).column("comm")
    assert col.type == pa.string()
    return col.to_pylist()  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "names",
    [[b"python3"], [b"\xff\xfebad"], [b"sixteen-chars-xy"], [b"a", b"a", b"a"],
     [b"\xffa", b"\xffa"], [b"python3", b"longer-name-abcd", b"python3"],
     [b"runX", b"BOX", b"X"], [b"\xc3(bad", b"ok", b"sixteen-chars-xy", b""]],
)  # fmt: skip
def test_comm_names(names: list[bytes]) -> None:
    want = [b.decode("utf-8", "replace") for b in names]
    assert _comm_col(names) == want


def test_comm_empty_batch() -> None:
    col = decode._comm(np.zeros(0, "S16"), np.zeros(0, np.uint32))
    assert (col.type, len(col)) == (pa.string(), 0)


# ------------------------------------------------------------------ ordering/values
def test_out_of_order_events_are_sorted() -> None:
    for ts in ([5, 3], [1, 3, 2], [4, 1, 2, 3]):
        ev = np.zeros(len(ts), DT)
        ev["ts_ns"] = ts
        ev["tid"] = ts
        b = decode_faults.faults_batch(ev)
        assert b.column("ts_ns").to_pylist() == sorted(ts)
        assert b.column("tid").to_pylist() == sorted(ts)


def test_sort_is_stable_for_equal_timestamps() -> None:
    rng = np.random.default_rng(7)
    n = 400
    ev = np.zeros(n, DT)
    ev["ts_ns"] = rng.integers(0, 5, n)
    ev["tid"] = np.arange(n)  # arrival order
    b = decode_faults.faults_batch(ev)
    got = list(zip(b.column("ts_ns").to_pylist(), b.column("tid").to_pylist(), strict=True))
    assert got == sorted(got)


def test_64_bit_values_are_exact() -> None:
    big = 2**53 + 1  # past float64 precision (104 days of uptime in ns)
    m = np.zeros(1, decode.MAPPING_DTYPE)
    m["ts_ns"], m["latency_ns"], m["op"], m["addr"], m["ret"] = big, big, 1, 1 << 40, 1 << 40
    b = decode.mappings_batch(m)
    assert (b.column("ts_ns")[0].as_py(), b.column("latency_ns")[0].as_py()) == (big, big)
    c = np.zeros(1, decode_cuda.CUDA_DTYPE)
    c["ts_ns"], c["latency_ns"], c["stack_id"], c["py_stack_id"], c["func"] = big, big, -1, -1, 1
    cb = decode_cuda.cuda_calls_batch(c, {1: "cuMemAlloc_v2"})
    assert (cb.column("ts_ns")[0].as_py(), cb.column("latency_ns")[0].as_py()) == (big, big)
    assert cb.column("stack_id")[0].as_py() is None


# ----------------------------------------------------------------------- mappings
def test_mmap_error_boundary_and_managed() -> None:
    rets = [-1, -4095, -4096, 0x7F0000000000, 0x7F0000200000, 0x7F0000400000, 0]
    ops = [1, 1, 1, 1, 1, 1, 2]
    devs = [3, 3, 3, 3, 1, 3, 3]
    m = np.zeros(len(rets), decode.MAPPING_DTYPE)
    m["ts_ns"] = np.arange(len(rets))
    m["op"], m["device"], m["ret"] = ops, devs, rets
    m["addr"] = [r if r > 0 else 0x7F0000600000 for r in rets]
    m["offset"] = m["addr"]  # UVM's managed mmap convention: offset == address
    b = decode.mappings_batch(m)
    # -1..-4095 are errnos (the kernel's IS_ERR_VALUE); -4096 is not
    addr = b.column("addr").to_pylist()
    assert [a is None for a in addr] == [True, True, False, False, False, False, False]
    # managed: a successful mmap of /dev/nvidia-uvm only; not ctl, not munmap
    assert b.column("managed").to_pylist() == [False, False, True, True, False, True, False]


# ------------------------------------------------------------------ seen / faults
def test_seen_rows_whole_record() -> None:
    ev = decode.seen_events({(10, 4): (3, -1), (10, 3): (2, 1), (11, 5): (1, -1)}, 777,
                            {10: "sixteen-chars-xyz-more", 11: None})  # fmt: skip
    want = np.zeros(3, decode.FD_DTYPE)
    for i, (pid, fd, kind, gpu, comm) in enumerate(
        [(10, 3, 2, 1, b"sixteen-chars-xy"), (10, 4, 3, -1, b"sixteen-chars-xy"),
         (11, 5, 1, -1, b"")]
    ):  # fmt: skip
        want[i] = (777, 0, pid, pid, fd, -1, decode.FD_SEEN, kind, gpu, 0, 0, 0, comm)
    assert ev.tobytes() == want.tobytes()


def test_fault_block_2m_and_access() -> None:
    ev = np.zeros(3, DT)
    ev["ts_ns"] = [1, 2, 3]
    ev["address"] = [0x7F0000200001, 0x7F00003FFFFF, 0x7F0000400000]
    ev["error_code"] = [0x6, 0x4, 0x2]
    b = decode_faults.faults_batch(ev)
    assert b.column("block_2m").to_pylist() == [0x7F0000200000, 0x7F0000200000, 0x7F0000400000]
    assert b.column("access_type_code").to_pylist() == [2, 1, 2]
    assert b.column("source_code").to_pylist() == [1, 1, 1]
    assert b.column("fault_type_code").to_pylist() == [255, 255, 255]
