"""CPU per record of reading a BPF ring buffer: libbpf's consumer (bcc's
`open_ring_buffer` + `ring_buffer_consume`, a ctypes callback copying each record)
against gputrace/record/ringbuf.py, on the same 4 MiB ring filled by the same tiny
program with records of --size bytes. Root and bcc.

    PYTHONPATH=$PWD python3 benchmarks/ringread/run.py [--size 40] [--rounds 5]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import time

from gputrace.record import loader, ringbuf

PROGRAM = r"""
struct big { u8 b[256]; };
BPF_ARRAY(config, u32, 2);
BPF_ARRAY(src, struct big, 1);
BPF_RINGBUF_OUTPUT(events, 1024);
TRACEPOINT_PROBE(syscalls, sys_enter_getppid) {
    u32 zero = 0, one = 1, *pid = config.lookup(&zero), *len = config.lookup(&one);
    struct big *s = src.lookup(&zero);
    if (!pid || !len || !s || *pid != (bpf_get_current_pid_tgid() >> 32)) return 0;
    for (int i = 0; i < 64; i++)  /* 64 records per syscall: filling is cheap */
        events.ringbuf_output(s, *len & 255, 0);
    return 0;
}
"""


def fill(records: int) -> None:
    for _ in range(records // 64):
        os.getppid()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    bcc = loader.import_bcc()
    b = bcc.BPF(text=PROGRAM)
    try:
        b["config"][ctypes.c_int(0)] = ctypes.c_uint(os.getpid())
        b["config"][ctypes.c_int(1)] = ctypes.c_uint(a.size)
        per_ring = (4 << 20) // ((a.size + 8 + 7) & ~7)
        n = per_ring * 9 // 10 // 64 * 64
        got: list[bytes] = []
        string_at = ctypes.string_at

        def cb(_ctx: object, data: int, size: int) -> int:
            got.append(string_at(data, size))
            return 0

        results: dict[str, list[float]] = {"libbpf": [], "ringbuf.py": []}
        ours = ringbuf.RingReader(b["events"].map_fd, got.append)
        b["events"].open_ring_buffer(cb)
        for _ in range(a.rounds):
            for name in results:
                fill(n)
                got.clear()
                t0 = time.thread_time()
                if name == "libbpf":
                    b.ring_buffer_consume()
                else:
                    ours.consume()
                dt = time.thread_time() - t0
                assert len(got) == n, (name, len(got), n)
                results[name].append(dt / n * 1e9)
        ours.close()
        for name, ns in results.items():
            print(f"{name:12s} {statistics.median(ns):7.1f} ns/record (median of "
                  f"{a.rounds}; {n} records of {a.size} B each; all: "
                  f"{', '.join(f'{x:.0f}' for x in ns)})")
    finally:
        b.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
