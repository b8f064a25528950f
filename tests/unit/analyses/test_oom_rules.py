"""The "no memory" rule and the verdict (gputrace/oom_rules.py): their boundaries,
and the recorder (`record.incidents.verdict`, behind --freeze-on oom and
gputrace_oom_total) and the oom report naming every failure alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from gputrace import oom_rules
from gputrace.record import incidents
from gputrace.trace.builder import GiB, MiB, TraceBuilder
from tests.analyze_helpers import analyze

CASES = [  # requested, free, largest, pool -> verdict
    (129 * MiB, 128 * MiB, 128 * MiB, None, "capacity"),
    (128 * MiB, 128 * MiB, 128 * MiB, None, "limit"),  # exactly the free memory fits
    (128 * MiB, 128 * MiB, 127 * MiB, None, "fragmentation"),
    (64 * MiB, 128 * MiB, 64 * MiB, None, "limit"),  # exactly the largest region fits
    (65 * MiB, 128 * MiB, 64 * MiB, None, "fragmentation"),
    (192 * MiB, 128 * MiB, 128 * MiB, 64 * MiB, "allocator pool"),  # free + pool == asked
    (193 * MiB, 128 * MiB, 128 * MiB, 64 * MiB, "capacity"),
    (64 * MiB, None, None, None, "unknown"),
    (None, 128 * MiB, 128 * MiB, None, "unknown"),
    (64 * MiB, 128 * MiB, None, None, "unknown"),
]


@pytest.mark.parametrize(("requested", "free", "largest", "pool", "want"), CASES)
def test_verdict_boundaries(requested: int | None, free: int | None, largest: int | None,
                            pool: int | None, want: str) -> None:
    assert oom_rules.verdict(requested, free, largest, pool) == want
    assert want in oom_rules.VERDICTS


def test_unknown_names_what_is_missing() -> None:
    assert oom_rules.judge(1, None, None, missing="layer rm_query not recorded").evidence == (
        "layer rm_query not recorded")
    assert "how many bytes" in oom_rules.judge(None, 1, 1).evidence


RULE_CASES = [  # layer, call, status, an nvidia-uvm command, "no memory"
    ("api", "cuMemAlloc_v2", 2, False, True),
    ("api", "cuMemAllocAsync_ptsz", 2, False, True),
    ("api", "cuMemAllocHost_v2", 2, False, False),  # host memory
    ("api", "cuMemAlloc_v2", 1, False, False),  # CUDA_ERROR_INVALID_VALUE
    ("api", "cuMemCreate", 2, False, False),
    ("syscall", "RM_ALLOC", 0x51, False, True),
    ("syscall", "RM_VID_HEAP_CONTROL", 0x51, False, True),
    ("syscall", "RM_CONTROL", 0x51, False, False),
    ("syscall", "UVM_MIGRATE", 0x51, True, True),
    ("syscall", "RM_ALLOC", 0, False, False),
    ("allocator", "oom", None, False, True),
    ("allocator", "alloc", None, False, False),
]


@pytest.mark.parametrize(("layer", "call", "status", "uvm", "want"), RULE_CASES)
def test_no_memory_rule(layer: str, call: str, status: int | None, uvm: bool,
                        want: bool) -> None:
    assert oom_rules.is_oom_call(layer, call, status, uvm) is want


def test_recorder_and_report_agree(tmp_path: Path) -> None:
    """Each case without a pool as one failure with its own incident sample: the report's
    verdict is the recorder's for the same sample."""
    cases = [c for c in CASES if c[3] is None and None not in c[:3]]
    b = TraceBuilder(layers=("api", "rm_query"), gpu_memory_bytes=GiB)
    b.process(7, "job")
    for i, (req, free, largest, _, _) in enumerate(cases):
        assert req is not None and free is not None and largest is not None
        t = 1.0 + 2 * i
        b.cuda_alloc(t, 7, req, result=2)
        b.gpu_memory(t + 0.001, 0, heap=GiB, free=free, largest=largest,
                     trigger="incident", delay_ns=990_000)
    got = analyze(b.build(tmp_path / "t"), ["oom"])["oom"]["incidents"]
    for inc, (req, free, largest, _, want) in zip(got, cases, strict=True):
        recorder = incidents.verdict(req, {"heap_free_bytes": free,
                                           "largest_free_bytes": largest})
        assert inc["verdict"] == recorder == want


def test_both_vectorized_rules_are_the_scalar_rule(tmp_path: Path) -> None:
    """The recorder's pyarrow mask (`record.incidents.is_oom`) and the report's polars
    filter (`analyses.oom.failures.failed_rows`) pick exactly the api and syscall rows
    `oom_rules.is_oom_call` calls "no memory"."""
    import pyarrow as pa

    from gputrace import schema
    from gputrace.analyses.helpers.inputs import inputs_from_trace
    from gputrace.analyses.oom.failures import failed_rows
    from gputrace.trace.reader import open_trace

    b = TraceBuilder(layers=("api", "syscall"))
    b.process(7, "job")
    rows = RULE_CASES[:-2]  # api and syscall (the allocator's are its action names)
    for i, (layer, call, status, uvm, _) in enumerate(rows):
        if layer == "api":
            b.row("cuda_calls", ts_ns=10**12 + i, pid=7, func=call, size_bytes=i + 1,
                  result=status, latency_ns=1)
        else:
            b.ioctl(i * 1e-9, 7, call, status=status, size_bytes=i + 1,
                    device_code=schema.DEV_UVM if uvm else 1)
    want = sorted(i + 1 for i, r in enumerate(rows) if r[4])
    got = failed_rows(inputs_from_trace(open_trace(b.build(tmp_path / "t"))))
    assert sorted(r["size_bytes"] for r in got) == want
    recorder = []
    for table in ("cuda_calls", "ioctls"):
        batch = pa.Table.from_pylist(b.rows[table], schema=schema.table(table).arrow_schema)
        mask = incidents.is_oom(table, batch)
        if mask is not None:
            recorder += batch.filter(mask).column("size_bytes").to_pylist()
    assert sorted(recorder) == want
