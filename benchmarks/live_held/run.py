"""What the live view's one figure per process costs: `LiveBytes.held` (the joined
model over the allocations alive now) for N sub-allocating pieces (each an API
allocation, the RM object made in its call and the UVM mapping of it: 3 N live
allocations), synthetic. No root needed:

    PYTHONPATH=$PWD python3 benchmarks/live_held/run.py --pieces 5000 50000
"""

from __future__ import annotations

import argparse
import time

from gputrace.live.aggregates import Aggregates
from gputrace.trace.builder import CLASS_DEVICE, MiB, TraceBuilder
from tests.unit.live.test_live_aggregates import Clock, feed

BASE = 0x7F0000000000


def one(n: int) -> tuple[float, float, int]:
    """(seconds to feed the rows, seconds of one held(), the figure)."""
    b = TraceBuilder()  # synthetic
    b.process(100, "train")
    dev = b.rm_alloc(0.0, 100, h_class=CLASS_DEVICE, gpu=0)
    for i in range(n):
        t, base = 0.1 + i / 1e6, BASE + i * 2 * MiB
        b.cuda_alloc(t, 100, MiB, ptr=base)
        h = b.rm_alloc(t + 1e-7, 100, size=2 * MiB, parent=dev)
        b.uvm(t + 2e-7, 100, "UVM_MAP_EXTERNAL_ALLOCATION", base=base, length=2 * MiB,
              h_object=h)
    agg = Aggregates(clock=Clock())
    t0 = time.perf_counter()
    feed(agg, b, "ioctls", "cuda_calls")
    t1 = time.perf_counter()
    held = agg.live_bytes.held([100])[100]
    return t1 - t0, time.perf_counter() - t1, held


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pieces", type=int, nargs="+", default=[5000, 50000])
    args = ap.parse_args()
    for n in args.pieces:
        fed, held, fig = one(n)
        assert fig == n * 2 * MiB, fig  # each piece once: its RM object
        print(f"{n:>8} pieces ({3 * n:,} live allocations): feed {fed:.2f} s, "
              f"held() {held * 1e3:.0f} ms ({held / (3 * n) * 1e9:.0f} ns each), "
              f"figure {fig // MiB:,} MiB")


if __name__ == "__main__":
    main()
