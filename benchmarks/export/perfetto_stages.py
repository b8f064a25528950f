"""Seconds of the two stages of `--format perfetto` on one trace, apart: the timeline
series (analyses: lifetimes, live bytes, decimation) and the packet encoding and
writing (the renderer), with the output size and the rows encoded.

    python benchmarks/export/perfetto_stages.py /work/bench-tmp/t1m
    # the same on another checkout (e.g. before a change):
    PYTHONPATH=/tmp/old python /tmp/old/benchmarks/export/perfetto_stages.py TRACE
"""

from __future__ import annotations

import os
import resource
import sys
import tempfile
import time

import polars as pl

from gputrace.analyses.helpers.inputs import inputs_from_trace
from gputrace.analyses.timeseries import timeline
from gputrace.render.perfetto import render_perfetto
from gputrace.trace.reader import open_trace


def main() -> None:
    inp = inputs_from_trace(open_trace(sys.argv[1]))
    rows = sum(inp.scan(t).select(pl.len()).collect().item()
               for t in ("ioctls", "cuda_calls", "faults", "migrations"))
    t0, c0 = time.perf_counter(), time.process_time()
    tl = timeline(inp)
    t1, c1 = time.perf_counter(), time.process_time()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "x.perfetto-trace")
        with open(out, "wb") as f:
            packets = render_perfetto(tl, f)
        t2, c2 = time.perf_counter(), time.process_time()
        size = os.path.getsize(out)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"rows {rows:,} packets {packets:,} output {size / 2**20:.1f} MiB "
          f"({size / max(packets, 1):.1f} B/packet) peak {peak:,.0f} MiB")
    print(f"timeline: wall {t1 - t0:.1f} s cpu {c1 - c0:.1f} s | "
          f"encode+write: wall {t2 - t1:.1f} s cpu {c2 - c1:.1f} s")


if __name__ == "__main__":
    main()
