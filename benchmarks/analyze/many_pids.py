"""`gputrace analyze --only leaks` (terminal report) on a trace of very many short processes.

    python benchmarks/analyze/many_pids.py OUT --pids 1_000_000   # builds, then times
    python benchmarks/analyze/many_pids.py OUT --pids 1_000_000 --only all --reuse

Each process makes `--allocs` cuMemAlloc_v2 calls 2 s apart (1 MiB each, never
freed) and a `processes` row (it exits at the end): one growth series and one
leak per allocation per process. Prints wall time, CPU and peak RSS of the
analysis, run in a fresh process.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa

from gputrace import schema
from gputrace.trace.builder import T0_NS, MiB
from gputrace.trace.writer import write_tables


def _table(name: str, cols: dict[str, object], n: int) -> pa.Table:
    t = schema.table(name)
    return pa.Table.from_arrays(
        [pa.array(cols[c.name], c.type) if c.name in cols else pa.nulls(n, c.type)
         for c in t.columns], schema=t.arrow_schema)  # fmt: skip


def build(out: str, pids: int, allocs: int) -> None:
    n = pids * allocs
    i = np.arange(n, dtype=np.int64)
    pid = (i // allocs + 1000).astype(np.int32)
    ts = T0_NS + (i % allocs) * 2_000_000_000 + i // allocs
    calls = _table("cuda_calls", {
        "ts_ns": ts, "pid": pid, "tid": pid, "comm": np.full(n, "worker"),
        "func": np.full(n, "cuMemAlloc_v2"), "size_bytes": np.full(n, MiB, np.uint64),
        "ptr": (0x7F0000000000 + i * MiB).astype(np.uint64), "result": np.zeros(n, np.int32),
        "latency_ns": np.full(n, 10_000, np.int64)}, n)
    end = T0_NS + allocs * 2_000_000_000 + pids
    p = np.arange(pids, dtype=np.int32) + 1000
    procs = _table("processes", {
        "pid": p, "ppid": np.ones(pids, np.int32), "comm": np.full(pids, "worker"),
        "start_ts_ns": np.full(pids, T0_NS, np.int64),
        "exit_ts_ns": np.full(pids, end, np.int64)}, pids)
    manifest = {"synthetic": True, "layers": ["api"], "start_ts_ns": T0_NS, "end_ts_ns": end,
                "target": {"mode": "synthetic"}}
    write_tables(out, {"cuda_calls": calls, "processes": procs}, manifest=manifest,
                 force=True)


CHILD = """
import contextlib, os, resource, sys, time
from gputrace.cli import main
t0, c0 = time.perf_counter(), time.process_time()
with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
    rc = main(["analyze", sys.argv[1], *(["--only", sys.argv[2]] if sys.argv[2] != "all"
                                          else [])])
ru = resource.getrusage(resource.RUSAGE_SELF)
print(f"rc={rc} wall_s={time.perf_counter() - t0:.1f} cpu_s={time.process_time() - c0:.1f} "
      f"peak_MiB={ru.ru_maxrss / 1024:.0f}")
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--pids", type=lambda s: int(s.replace("_", "")), default=1_000_000)
    ap.add_argument("--allocs", type=int, default=4)
    ap.add_argument("--only", default="leaks", help="the report to time; all: every one")
    ap.add_argument("--reuse", action="store_true", help="time the trace OUT already holds")
    a = ap.parse_args()
    if not a.reuse:
        t = time.perf_counter()
        build(a.out, a.pids, a.allocs)
        print(f"built {a.pids} processes x {a.allocs} allocations in "
              f"{time.perf_counter() - t:.1f} s", flush=True)
    subprocess.run([sys.executable, "-c", CHILD, a.out, a.only], check=True)


if __name__ == "__main__":
    main()
