"""Property: for random alloc/free/exit sequences, the leak set the analysis finds
equals the one a plain Python model of the lifetimes computes."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gputrace.trace.builder import CLASS_DEVICE, T0_NS, TraceBuilder, ns
from tests.analyze_helpers import analyze

PIDS = (10, 11)
KEYS = (0xA0, 0xA1, 0xA2)  # few keys, so handles and pointers get reused
CLIENT = {10: 0xC0000010, 11: 0xC0000011}
DEVICE = 0xD0

op = st.one_of(
    st.tuples(st.just("alloc"), st.sampled_from(PIDS), st.sampled_from(KEYS),
              st.integers(1, 64), st.booleans()),
    st.tuples(st.just("free"), st.sampled_from(PIDS), st.sampled_from(KEYS)),
    st.tuples(st.just("free_device"), st.sampled_from(PIDS)),
    st.tuples(st.just("exit"), st.sampled_from(PIDS)),
)

Leak = tuple[str, int, int, int, int, str]


def play(ops: list[tuple[object, ...]], layer: str) -> tuple[TraceBuilder, set[Leak]]:
    """Build the trace for `ops` and return the model's leak set."""
    b = TraceBuilder(layers=("syscall", "api"))
    live: dict[tuple[int, int], tuple[int, int]] = {}  # (pid, key) -> (size, ts)
    exited: dict[int, float] = {}
    leaks: set[Leak] = set()
    for pid in PIDS:
        if layer == "rm":
            b.rm_alloc(0.0, pid, h_class=CLASS_DEVICE, handle=DEVICE, client=CLIENT[pid])
    for i, o in enumerate(ops):
        t = 0.1 + 0.01 * i
        pid = int(o[1])  # type: ignore[call-overload]
        if pid in exited:
            continue
        if o[0] == "alloc":
            key, size, ok = int(o[2]), int(o[3]) * 4096, bool(o[4])  # type: ignore[call-overload]
            if (pid, key) in live:
                continue  # a live pointer or handle is never handed out twice
            if layer == "api":
                b.cuda_alloc(t, pid, size, ptr=key if ok else 0, result=0 if ok else 2)
            else:
                b.rm_alloc(t, pid, size=size, handle=key, client=CLIENT[pid], parent=DEVICE,
                           status=0 if ok else 0x51)
            if ok:
                live[(pid, key)] = (size, ns(t))
        elif o[0] == "free":
            key = int(o[2])  # type: ignore[call-overload]
            if layer == "api":
                b.cuda_free(t, pid, key)
            else:
                b.rm_free(t, pid, handle=key, client=CLIENT[pid])
            live.pop((pid, key), None)
        elif o[0] == "free_device" and layer == "rm":
            b.rm_free(t, pid, handle=DEVICE, client=CLIENT[pid])  # frees the subtree
            b.rm_alloc(t + 0.001, pid, h_class=CLASS_DEVICE, handle=DEVICE, client=CLIENT[pid])
            for k in [k for k in live if k[0] == pid]:
                del live[k]
        elif o[0] == "exit":
            exited[pid] = t
            for (p, key), (size, ts) in list(live.items()):
                if p == pid:
                    leaks.add((layer, pid, key, size, ts, "unfreed_at_exit"))
                    del live[(p, key)]
    for (pid, key), (size, ts) in live.items():
        leaks.add((layer, pid, key, size, ts, "alive_at_end"))
    for pid in PIDS:
        b.process(pid, f"p{pid}", exit=exited.get(pid))
    b.duration_s = 0.1 + 0.01 * len(ops) + 1
    return b, leaks


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(op, max_size=40), layer=st.sampled_from(["api", "rm"]))
def test_leak_set_equals_model(ops: list[tuple[object, ...]], layer: str) -> None:
    b, expected = play(ops, layer)
    with tempfile.TemporaryDirectory() as d:
        doc = analyze(b.build(Path(d) / "t"), ["leaks"])
    found = {(a["layer"], a["pid"], a["id"], a["size_bytes"], a["alloc_ts_ns"], a["kind"])
             for a in doc["leaks"]["allocations"]}
    assert found == expected
    assert all(a["alloc_ts_ns"] >= T0_NS for a in doc["leaks"]["allocations"])
