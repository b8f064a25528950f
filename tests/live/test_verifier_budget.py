"""The kernel's verifier walks every function of the recorder's two BPF programs at
every start, cache or not (gputrace/record/verifier.py): a probe change that
multiplies its paths makes every recording start slower, long before the kernel's
limit of 1,000,000 instructions refuses it. Each function is held to a quarter of
that limit; the three that once walked 490k-780k (the mmap and munmap exits, the
API layer's return probe: benchmarks/README.md "Start-up") to their own bounds."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.record_helpers import live_skip_reason

pytestmark = [pytest.mark.live]
_SKIP = live_skip_reason()
if _SKIP is not None:
    pytestmark.append(pytest.mark.skip(reason=_SKIP))

BUDGET = 250_000
# measured 2026-12-04 (Linux 6.18, bcc 0.26): 85k, 33k, 147k (before: 701k, 493k, 781k)
HEAVY = {"tracepoint__syscalls__sys_exit_mmap": 150_000,
         "tracepoint__syscalls__sys_exit_munmap": 100_000,
         "uretprobe_cuda": 200_000}  # fmt: skip
TP_BTF = {"gt_task_rename", "cuda_task_rename"}  # a plain load refuses these: not counted


def test_every_function_walks_within_its_budget(tmp_path: Path) -> None:
    from gputrace.record import bpf_cache, loader, verifier
    from gputrace.record.api import libcuda
    from gputrace.record.options import Options, build_program

    source, flags, _drv, _plan = build_program(Options(output=str(tmp_path / "T")))
    programs = [(source, flags, "syscall-layer"), (*libcuda.program(), "api-layer")]
    bpf_cache.compile_entries(tmp_path, programs)
    bcc = loader.import_bcc()
    walked: dict[str, int] = {}
    for text, fl, what in programs:
        entry = bpf_cache.read(tmp_path, bpf_cache.key(text, fl))
        assert entry is not None, f"{what}: not compiled"
        for w in verifier.walks(bcc, entry):
            if w.function in TP_BTF:
                continue
            assert w.processed is not None, f"{what} {w.function}: refused"
            walked[w.function] = max(w.processed, walked.get(w.function, 0))
    assert set(HEAVY) <= set(walked)
    assert len(walked) > 40  # both programs' functions, the per-symbol uprobes included
    over = {f: n for f, n in walked.items() if n > HEAVY.get(f, BUDGET)}
    assert over == {}
