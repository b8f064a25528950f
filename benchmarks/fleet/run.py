"""Fleet benchmark: export N synthetic traces, then `fleet analyze` with 1 and 2 local
Dask workers; wall times and each worker's peak memory.

    python3 benchmarks/fleet/run.py --traces 1000 --events 100000 --out /tmp/fleetbench

Traces (synthetic, gputrace.trace.builder.TraceBuilder): a few templates are built, each a
workload of `--events` rows (RM alloc/free pairs with 1 % leaked, cuMemAlloc/cuMemFree
pairs, GPU faults and migrations, PMM chunk events); each of the N traces is a copy of a
template renamed as another host and recording (manifest hostname, creation time, driver
version), so the fleet has N distinct recordings whose per-trace work is the same size.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

from gputrace.trace.builder import MiB, TraceBuilder  # noqa: E402

TEMPLATES = 4
DRIVERS = ("580.142", "575.57.08", "570.133.20")


def template(path: Path, events: int, seed: int) -> None:
    """One synthetic workload of about `events` rows (see the module docstring)."""
    b = TraceBuilder(("syscall", "api", "driver"), gpus=2)
    pids = [1000 + seed * 10 + k for k in range(4)]
    for p in pids:
        b.process(p, f"job{p}", cmdline=f"python train.py --rank {p % 4}")
    n = 0
    i = 0
    while n < events:
        p = pids[i % len(pids)]
        t = i * 1e-4
        h = b.rm_alloc(t=t, pid=p, size=2 * MiB)
        n += 1
        if i % 100 != seed:  # 1 % leaked
            b.rm_free(t=t + 5e-5, pid=p, handle=h)
            n += 1
        ptr = b.cuda_alloc(t=t, pid=p, size=MiB)
        n += 1
        if i % 50:
            b.cuda_free(t=t + 5e-5, pid=p, ptr=ptr)
            n += 1
        if i % 4 == 0:
            b.gpu_fault(t=t, gpu=i % 2, address=0x7F0000000000 + (i % 512) * 2 * MiB, pid=p)
            b.migration(t=t, src=-1, dst=i % 2, address=0x7F0000000000 + (i % 512) * 2 * MiB,
                        size=2 * MiB, pid=p)
            b.chunk(t=t, gpu=i % 2, op="alloc" if i % 8 else "free",
                    address=(i % 4096) * 2 * MiB, log2_size=21)
            n += 3
        i += 1
    b.build(path, force=True)


def copies(templates: list[Path], out: Path, n: int) -> list[Path]:
    paths = []
    for k in range(n):
        src, dst = templates[k % len(templates)], out / f"trace-{k:05d}"
        if not dst.exists():
            shutil.copytree(src, dst)
            m = json.loads((dst / "manifest.json").read_text())
            m["host"]["hostname"] = f"node{k % 100:03d}"
            m["created_unix_s"] = 1.79e9 + k
            m["driver_version"] = DRIVERS[k % len(DRIVERS)]
            (dst / "manifest.json").write_text(json.dumps(m))
        paths.append(dst)
    return paths


def timed(cmd: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode:
        sys.exit(f"failed: {' '.join(cmd[:6])} ...\n{r.stderr}")
    return time.perf_counter() - t0, r.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=int, default=1000)
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    ap.add_argument("--out", type=Path, default=Path("/tmp/fleetbench"))
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    tpl = []
    for s in range(TEMPLATES):
        p = a.out / f"template-{a.events}-{s}"
        if not p.exists():
            template(p, a.events, s)
        tpl.append(p)
    traces = copies(tpl, a.out / f"traces-{a.events}", a.traces)
    rows = sum(json.loads((tpl[0] / "manifest.json").read_text())["tables"][t]["rows"]
               for t in json.loads((tpl[0] / "manifest.json").read_text())["tables"])
    print(f"{a.traces} traces of {rows} rows each, built in {time.perf_counter() - t0:.1f} s")
    ds = a.out / f"ds-{a.traces}-{a.events}"
    shutil.rmtree(ds, ignore_errors=True)
    gt = [sys.executable, "-m", "gputrace.cli"]
    secs, _ = timed([*gt, "export", *map(str, traces), "--to", str(ds)])
    size = sum(f.stat().st_size for f in ds.rglob("*") if f.is_file())
    print(f"export: {secs:.1f} s ({secs / a.traces * 1e3:.0f} ms/trace), {size / 2**20:.0f} MiB")
    secs, _ = timed([*gt, "export", *map(str, traces), "--to", str(ds)])
    print(f"export again (nothing to do): {secs:.1f} s")
    for w in (int(x) for x in a.workers.split(",")):
        secs, out = timed([*gt, "fleet", "analyze", str(ds), "--workers", str(w), "-f", "json"])
        doc = json.loads(out)
        rss = [f"{b / 2**20:.0f}" for b in doc["engine"]["worker_peak_rss_bytes"]]
        print(f"fleet analyze, {w} worker(s): {secs:.1f} s ({doc['traces']} traces, "
              f"{secs / doc['traces'] * 1e3:.0f} ms/trace), worker peak RSS MiB {rss}, "
              f"leaked {doc['leaks']['total_bytes']} B")


if __name__ == "__main__":
    main()
