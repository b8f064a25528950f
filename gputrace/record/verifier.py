"""What the kernel's verifier does with each function of a compiled program: how
many instructions it walked (it refuses a program past 1,000,000) and how many
states it kept, and the CPU of the load. The verifier runs at every load, cache or
not: it is most of a warm start (benchmarks/README.md "Start-up"), and a probe
change that multiplies its paths shows here first
(benchmarks/startup/verifier_stats.py, tests/live/test_verifier_budget.py).
"""

from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass
from typing import Any

from gputrace.record import bpf_object

LIMIT = 1_000_000  # BPF_COMPLEXITY_LIMIT_INSNS
_TRACEPOINT, _KPROBE = 5, 2


@dataclass(frozen=True)
class Walk:
    function: str
    insns: int
    processed: int | None  # None: the function is not a tracepoint/kprobe program
    states: int | None
    cpu_s: float


def walks(bcc: Any, entry: bpf_object.Entry, skip: tuple[str, ...] = ()) -> list[Walk]:
    """Load each function of `entry` (maps made for it, closed after) with the
    verifier's statistics; functions whose names start with a `skip` prefix are left
    out. tp_btf programs fail this plain load: their counts are None."""
    obj = object.__new__(bpf_object.make_class(bcc))
    obj._init_loaded(entry)
    out = []
    try:
        for name in entry.functions:
            if name.startswith(skip):
                continue
            start, size = obj.instructions(name)
            lic = ctypes.create_string_buffer(b"GPL")
            log = ctypes.create_string_buffer(1 << 16)
            attr = bpf_object._ProgAttr(
                prog_type=_TRACEPOINT if name.startswith("tracepoint__") else _KPROBE,
                insn_cnt=size // 8, insns=start, license=ctypes.addressof(lic),
                prog_name=name.encode()[:15], log_level=4, log_size=len(log),
                log_buf=ctypes.addressof(log))  # fmt: skip
            t = time.thread_time()
            fd = bpf_object._bpf(5, attr)
            cpu = time.thread_time() - t
            processed = states = None
            if fd >= 0:
                os.close(fd)
                # "processed N insns (limit 1000000) max_states_per_insn M total_states S ..."
                words = log.value.decode(errors="replace").split()
                if "processed" in words:
                    processed = int(words[words.index("processed") + 1])
                if "total_states" in words:
                    states = int(words[words.index("total_states") + 1])
            out.append(Walk(name, size // 8, processed, states, cpu))
    finally:
        obj.cleanup()
    return out
