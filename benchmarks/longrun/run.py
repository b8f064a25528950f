#!/usr/bin/env python3
"""Does a recorder that runs for hours keep bounded memory?
Not a CI test: it runs for --minutes (30 by default). Run as root from the
repository root:

    python3 benchmarks/longrun/run.py                 # 30 minutes at 100 k events/s
    python3 benchmarks/longrun/run.py --minutes 3     # the short version

`gputrace record` runs `paced.c` as its command: --rate RM_CONTROL ioctls per
second on a mknod copy of /dev/null named nvidiactl, every one decoded and
written. Every --every seconds it prints the recorder's resident memory (VmRSS
of the recorder process, its threads included, and its anonymous, file and
shared-memory parts), its CPU since the last line and
the trace's Parquet bytes so far; at the end the events recorded against those
issued, the drops, and the RSS growth from the first sample after warm-up (the
2nd) to the last.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from common import build_storm, cpu_s, start_recorder  # noqa: E402


def status_kib(pid: int) -> dict[str, int]:
    """VmRSS and its parts (RssAnon: heaps; RssFile: libraries, LLVM in bcc;
    RssShmem: the BPF ring buffers mapped into the recorder), KiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key = line.split(":", 1)[0]
        if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
            out[key] = int(line.split()[1])
    return out


PARTS = ("RssAnon", "RssFile", "RssShmem")


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MiB) points, in MiB per minute."""
    mt = sum(t for t, _ in points) / len(points)
    mr = sum(r for _, r in points) / len(points)
    var = sum((t - mt) ** 2 for t, _ in points)
    return 60 * sum((t - mt) * (r - mr) for t, r in points) / var if var else 0.0


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*.parquet") if p.is_file())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--rate", type=int, default=100_000, help="ioctls per second")
    ap.add_argument("--every", type=float, default=30.0, help="seconds between samples")
    a = ap.parse_args()
    secs = max(1, round(a.minutes * 60))
    with tempfile.TemporaryDirectory(dir=os.environ.get("GPUTRACE_BENCH_TMP")) as d:
        tmp = Path(d)
        dev = tmp / "dev"
        dev.mkdir()
        os.mknod(dev / "nvidiactl", 0o666 | 0o020000, os.makedev(1, 3))
        exe = build_storm(HERE / "paced.c", tmp)
        out = tmp / "trace"
        rec = start_recorder(out, "--device-dir", str(dev), "--", str(exe), str(dev),
                             str(a.rate), str(secs))  # fmt: skip
        pid = rec.proc.pid
        t0 = last_t = time.monotonic()
        last_cpu = cpu_s(pid)
        samples: list[tuple[float, int]] = []
        print(f"{'t s':>7} {'RSS MiB':>8} {'anon':>7} {'file':>7} {'shmem':>7} {'cores':>6} "
              f"{'parquet MiB':>12}  "
              f"(rate {a.rate}/s for {secs} s)", flush=True)  # fmt: skip
        while rec.proc.poll() is None:
            time.sleep(min(a.every, 1.0))
            now = time.monotonic()
            if now - last_t < a.every:
                continue
            try:
                st, cpu = status_kib(pid), cpu_s(pid)
            except (FileNotFoundError, ProcessLookupError):
                break
            rss = st["VmRSS"]
            samples.append((now - t0, rss))
            parts = " ".join(f"{st.get(k, 0) / 1024:7.1f}" for k in PARTS)
            cores = (cpu - last_cpu) / (now - last_t)
            print(f"{now - t0:7.0f} {rss / 1024:8.1f} {parts} {cores:6.2f} "
                  f"{du(out) / 2**20:12.1f}", flush=True)  # fmt: skip
            last_t, last_cpu = now, cpu
        rc = rec.wait(600)
        from gputrace.trace.reader import open_trace

        t = open_trace(out)
        rows, drops = t.rows("ioctls"), sum(t.drops.values())
    issued = a.rate * secs
    print(f"recorder exit {rc}; ioctls recorded {rows} of {issued} issued; drops {drops}")
    if len(samples) >= 3:
        (ta, ra), (tb, rb) = samples[1], samples[-1]
        print(f"RSS {ra / 1024:.1f} MiB at {ta:.0f} s -> {rb / 1024:.1f} MiB at {tb:.0f} s: "
              f"{(rb - ra) / 1024 / max((tb - ta) / 60, 1e-9):+.2f} MiB/min; "
              f"peak {max(r for _, r in samples) / 1024:.1f} MiB")  # fmt: skip
        # Allocators settle for minutes; a leak shows as a slope that stays in the 2nd half.
        half = [(t, r / 1024) for t, r in samples if t >= samples[-1][0] / 2]
        if len(half) >= 3:
            print(f"2nd half ({half[0][0]:.0f}-{half[-1][0]:.0f} s): least-squares slope "
                  f"{slope(half):+.2f} MiB/min, RSS {min(r for _, r in half):.1f}-"
                  f"{max(r for _, r in half):.1f} MiB")  # fmt: skip
    return 0 if rows == issued and drops == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
