"""Time and peak memory of `gputrace analyze --format html` and `--format perfetto` on
one trace. Each export runs in a fresh process under GNU time (/usr/bin/time), whose
maximum resident set size is that process's own peak.

    python benchmarks/analyze/gen.py /work/bench-tmp/t10m --events 10_000_000
    python benchmarks/export/bench.py /work/bench-tmp/t10m [html,perfetto]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time


def run(trace: str, fmt: str, out: str) -> tuple[float, float, float, int]:
    """(wall s, cpu s, peak MiB, output bytes) of one export in a child process."""
    stats = out + ".time"
    t0 = time.perf_counter()
    subprocess.run(["/usr/bin/time", "-f", "%U %S %M", "-o", stats, sys.executable, "-m",
                    "gputrace.cli", "analyze", trace, "--format", fmt, "-o", out], check=True)
    wall = time.perf_counter() - t0
    with open(stats) as f:
        user, system, kib = f.read().split()[-3:]
    return wall, float(user) + float(system), int(kib) / 1024, os.path.getsize(out)


def main() -> None:
    trace = sys.argv[1]
    fmts = sys.argv[2].split(",") if len(sys.argv) > 2 else ["html", "perfetto"]
    print("| format | wall s | cpu s | peak MiB | output MiB |")
    print("|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in fmts:
            out = os.path.join(tmp, f"out.{fmt}")
            wall, cpu, peak, size = run(trace, fmt, out)
            print(f"| {fmt} | {wall:.1f} | {cpu:.1f} | {peak:,.0f} | {size / 2**20:,.1f} |",
                  flush=True)
            os.unlink(out)


if __name__ == "__main__":
    main()
