"""Delay from an out-of-memory failure's return to the RM sample taken for it.

One `gputrace record` of the FUSE stand-in (1 GiB, first-fit heap) whose command
asks N times for more than the GPU holds (RM_ALLOC → NV_ERR_NO_MEMORY), each after a
random pause (0.2-0.6 s: the failures fall at every phase of the recorder's 50 ms
poll); prints the distribution of `gpu_memory.delay_ns` over the incident samples.

    sudo python3 benchmarks/oom_delay/run.py --failures 40
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))


def storm(devdir: str, n: int, seed: int) -> int:
    """The recorded command: N failing allocations, randomly spaced."""
    from tests.standin.oom_scenario import BUDGET_MIB, Holder

    rng = random.Random(seed)
    h = Holder(devdir)
    try:
        for _ in range(n):
            time.sleep(rng.uniform(0.2, 0.6))
            if h.alloc("big", 2 * BUDGET_MIB)["status"] != 0x51:
                return 1
    finally:
        h.close()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--failures", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--storm", nargs=1, help=argparse.SUPPRESS)  # the recorded side
    a = ap.parse_args()
    if a.storm:
        return storm(a.storm[0], a.failures, a.seed)
    import polars as pl

    from benchmarks.common import start_recorder
    from gputrace.trace.reader import open_trace
    from tests.record_helpers import standin_driver_args
    from tests.standin.oom_scenario import BUDGET_MIB, MIB
    from tests.standin.standin import mounted_driver

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        out = tmp / "trace"
        with mounted_driver(tmp, budget=BUDGET_MIB * MIB, gpus=1) as dev:
            rec = start_recorder(out, "--device-dir", str(dev), *standin_driver_args(), "--",
                                 sys.executable, __file__, "--failures", str(a.failures),
                                 "--seed", str(a.seed), "--storm", str(dev))  # fmt: skip
            rc = rec.wait(timeout=600)
        if rc != 0:
            print("".join(rec.stderr), file=sys.stderr)
            return 1
        t = open_trace(out)
        inc = t.scan("gpu_memory").filter(pl.col("trigger") == "incident").collect()
        ms = (inc["delay_ns"].cast(pl.Float64) / 1e6).sort()
        n = ms.len()
        print(f"failures {a.failures}, incident samples {n}")
        if n:
            print(f"delay ms: min {ms.min():.2f}  median {ms.median():.2f}  "
                  f"p90 {ms[int(0.9 * (n - 1))]:.2f}  max {ms.max():.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
