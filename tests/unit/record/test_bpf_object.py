"""A compiled program kept as data and loaded without clang (gputrace/record/bpf_object.py)
behaves as bcc's own object: a small program with a hash map, an array, a task-storage
map (needs the BTF made here), a ring buffer and an autoloaded tracepoint is compiled by
bcc, extracted, loaded again from the Entry (JSON round trip), and its tables, ring
buffer and tracepoint work; a map reference of another module is refused at extract.
Root and bcc (skipped otherwise)."""

from __future__ import annotations

import ctypes
import json
import os

import pytest

from gputrace.errors import GputraceError
from gputrace.record import bpf_object

PROGRAM = r"""
#include <linux/sched.h>
struct leaf { u64 n; u32 pid; };
BPF_HASH(counts, u32, struct leaf, 64);
BPF_ARRAY(config, u32, 1);
BPF_TASK_STORAGE(seen, u64);  /* made, not used: its BTF is bpf_object's */
BPF_RINGBUF_OUTPUT(events, 1);
TRACEPOINT_PROBE(syscalls, sys_enter_getppid) {
    u32 zero = 0, *want = config.lookup(&zero);
    u32 pid = bpf_get_current_pid_tgid() >> 32;
    if (!want || *want != pid) return 0;
    struct leaf init = {}, *l = counts.lookup_or_try_init(&pid, &init);
    if (l) { l->n++; l->pid = pid; }
    events.ringbuf_output(&pid, sizeof(pid), 0);
    return 0;
}
"""


@pytest.fixture(scope="module")
def bcc() -> object:
    from gputrace.record import loader

    if os.geteuid() != 0:
        pytest.skip("needs root")
    try:
        return loader.import_bcc()
    except GputraceError as e:
        pytest.skip(str(e))


def test_extracted_program_loads_and_runs_like_bccs(bcc: object) -> None:
    b = bcc.BPF(text=PROGRAM)  # type: ignore[attr-defined]
    try:
        entry = bpf_object.extract(b.module)
    finally:
        b.cleanup()
    assert {t.name for t in entry.tables} == {"counts", "config", "seen", "events"}
    assert list(entry.functions) == ["tracepoint__syscalls__sys_enter_getppid"]
    again = bpf_object.Entry.from_json(json.loads(json.dumps(entry.to_json())))
    assert again == entry

    obj = bpf_object.load(bcc, again)
    try:
        assert obj.num_open_tracepoints() == 1
        assert "counts" in obj and "nothing" not in obj
        obj["config"][ctypes.c_int(0)] = ctypes.c_uint(os.getpid())
        got: list[int] = []

        def cb(_ctx: object, data: int, size: int) -> int:
            got.append(int.from_bytes(ctypes.string_at(data, size), "little"))
            return 0

        obj["events"].open_ring_buffer(cb)
        for _ in range(3):
            os.getppid()
        obj.ring_buffer_consume()
        leaf = obj["counts"][ctypes.c_uint(os.getpid())]
        assert (leaf.n, leaf.pid) == (3, os.getpid())
        assert got == [os.getpid()] * 3
    finally:
        obj.cleanup()
    assert obj.num_open_tracepoints() == 0
