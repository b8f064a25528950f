#!/usr/bin/env python3
"""`gputrace convert` speed: decode a raw trace (record --raw, or parts spilled by a busy
recorder) into Parquet, one part at a time and side by side, next to what the same events
cost the recorder when it decodes them as they come.

    python3 benchmarks/convert/bench.py [--events 4000000] [--parts 4] [--jobs 1,2]

The raw trace is synthetic (labelled so in its manifest): storm-like RM_CONTROL records
(benchmarks/ioctl_storm), two threads, latencies 200..3000 ns, written with
`TraceWriter.append_raw` in 8.6 MB frames as the recorder hands them over. Each convert
runs in a fresh process (`/usr/bin/time`-style: wall, CPU, peak RSS of that process). The
"decoded while recording" line is the recorder's other path, in this process: decode each
frame (`decode.ioctl_rows`) and append it to a TraceWriter, rotating per part.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

from gputrace.record import decode  # noqa: E402
from gputrace.trace.writer import TraceWriter  # noqa: E402

FRAME = 64 * decode.IOCTL_DTYPE.itemsize * 800  # ~51 k events: a recorder work item


def events(n: int, t0: int, rng: np.random.Generator) -> np.ndarray:
    ev = np.zeros(n, decode.IOCTL_DTYPE)
    ev["ts_ns"] = t0 + np.cumsum(rng.integers(300, 2000, n))
    ev["latency_ns"] = rng.integers(200, 3000, n)
    ev["pid"], ev["fd"], ev["cmd"], ev["nr"] = 4242, 5, 0xC020462A, 0x2A
    ev["tid"] = 4242 + rng.integers(0, 2, n)
    ev["h_client"], ev["h_object"], ev["ctrl_cmd"], ev["valid"] = (
        0xC1D00001,
        0x5C000002,
        0x20800A,
        3,
    )
    ev["comm"], ev["device"], ev["gpu_index"] = b"storm", 1, 0
    return ev


def write(out: Path, n: int, parts: int, raw: bool) -> float:
    """A trace of `n` events in `parts` parts; the CPU seconds the writing took."""
    rng = np.random.default_rng(1)
    w = TraceWriter(out, manifest={"synthetic": True})
    t, cpu = 10**12, 0.0
    for _ in range(parts):
        data = events(n // parts, t, rng)
        t = int(data["ts_ns"][-1])
        buf = data.tobytes()
        c = time.process_time()
        for i in range(0, len(buf), FRAME):
            if raw:
                w.append_raw("ioctls", "ioctl_event", decode.IOCTL_DTYPE, buf[i : i + FRAME])
            else:
                rows, _bad = decode.ioctl_rows(
                    np.frombuffer(buf[i : i + FRAME], decode.IOCTL_DTYPE)
                )
                if rows is not None:
                    w.append("ioctls", rows)
        w.rotate()
        cpu += time.process_time() - c
    w.close()
    return cpu


def convert(src: Path, tmp: Path, jobs: int) -> tuple[float, float, int]:
    """(wall s, CPU s, peak KiB) of `gputrace convert -j jobs` on a copy of `src`."""
    t = tmp / f"conv{jobs}"
    shutil.rmtree(t, ignore_errors=True)
    shutil.copytree(src, t)
    w0 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-m", "gputrace.cli", "convert", str(t), "-j", str(jobs)],
                         cwd=ROOT, stdout=subprocess.DEVNULL)  # fmt: skip
    _, status, ru = os.wait4(p.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError("gputrace convert failed")
    return time.monotonic() - w0, ru.ru_utime + ru.ru_stime, ru.ru_maxrss


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=4_000_000)
    ap.add_argument("--parts", type=int, default=4)
    ap.add_argument("--jobs", default="1,2")
    a = ap.parse_args()
    n = a.events
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        raw_cpu = write(tmp / "raw", n, a.parts, raw=True)
        dec_cpu = write(tmp / "decoded", n, a.parts, raw=False)
        rows = [(f"convert -j {j}", *convert(tmp / "raw", tmp, int(j))) for j in a.jobs.split(",")]
    load = os.getloadavg()
    print(
        f"{n} events in {a.parts} parts (synthetic); load {load[0]:.1f} {load[1]:.1f}; "
        f"peak RSS of this process {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss} KiB"
    )
    print(
        f"written raw while recording      CPU {raw_cpu:6.2f} s  {raw_cpu / n * 1e9:6.0f} ns/event"
    )
    print(
        f"decoded while recording          CPU {dec_cpu:6.2f} s  {dec_cpu / n * 1e9:6.0f} ns/event"
    )
    for label, wall, cpu, peak in rows:
        print(
            f"{label:<32} CPU {cpu:6.2f} s  {cpu / n * 1e9:6.0f} ns/event  wall {wall:.2f} s  "
            f"peak {peak / 1024:.0f} MiB  (x{cpu / dec_cpu:.2f} the decoded recorder's CPU)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
