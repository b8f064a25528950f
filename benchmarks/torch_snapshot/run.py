"""Importing a long PyTorch memory history: gputrace (import + the allocator reports)
beside PyTorch's own `_memory_viz.py` (`trace` and `stats`, the `segsum` text), on the
same SYNTHETIC snapshot of N trace entries. Wall time and peak memory (max RSS of the
child process) of each, one row per tool.

    python3 benchmarks/torch_snapshot/run.py --entries 100000 1000000 \\
        --memory-viz /path/to/torch/cuda/_memory_viz.py

`_memory_viz.py` is PyTorch's file, run as it is (it imports only the standard
library); it is not part of this repository. The snapshot: one device, 64 segments of
64 MiB made at the start, then allocations of 1 MiB blocks (requests 1 MiB minus up
to 4095 bytes) from 10 stacks of 20 frames (a frames list per entry, its frame dicts
shared, as PyTorch writes them), each freed (free_requested, free_completed) except
every 1000th, kept to the end; `time_us` increasing.

Every tool runs with its bytecode cached, as an installed package's is (one unmeasured
warm-up run of each first). `gputrace-python` is gputrace without its compiled entry
reader (GPUTRACE_NO_COMPILED_SCAN=1: an install where no C compiler was).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20
SEGS, SEG_SIZE, SLOTS = 64, 64 * MiB, 64
T0 = 1_767_225_600_000_000


def snapshot(n: int) -> dict[str, Any]:
    """A snapshot of about `n` trace entries (see the module's docstring)."""
    base = 0x7F00_0000_0000
    stacks = [[{"name": f"fn{s}_{d}", "filename": f"/home/u/proj/mod{d}.py", "line": 10 + d}
               for d in range(20)] for s in range(10)]
    trace: list[dict[str, Any]] = []
    t = T0
    for k in range(SEGS):
        trace.append({"action": "segment_alloc", "addr": base + k * SEG_SIZE,
                      "size": SEG_SIZE, "stream": 0, "time_us": t, "frames": stacks[0]})
    free_slots = [base + k * SEG_SIZE + j * MiB for k in range(SEGS) for j in range(SLOTS)]
    free_slots.reverse()
    kept: dict[int, int] = {}
    i = 0
    while len(trace) < n and free_slots:
        t += 3
        addr = free_slots.pop()
        req = MiB - (i * 7919) % 4096
        fr = stacks[i % 10]  # a list per entry, its frame dicts shared, as PyTorch writes
        trace.append({"action": "alloc", "addr": addr, "size": req, "stream": 0,
                      "time_us": t, "frames": list(fr)})
        if i % 1000 == 999:
            kept[addr] = req
        else:
            for a in ("free_requested", "free_completed"):
                trace.append({"action": a, "addr": addr, "size": req, "stream": 0,
                              "time_us": t + 1, "frames": list(fr)})
            free_slots.append(addr)
        i += 1
    segments = []
    for k in range(SEGS):
        s = base + k * SEG_SIZE
        blocks = []
        for j in range(SLOTS):
            a = s + j * MiB
            if a in kept:
                blocks.append({"address": a, "size": MiB, "requested_size": kept[a],
                               "state": "active_allocated", "frames": stacks[0]})
            else:
                blocks.append({"address": a, "size": MiB, "requested_size": 0,
                               "state": "inactive", "frames": []})
        alloc = sum(b["size"] for b in blocks if b["state"] != "inactive")
        segments.append({"device": 0, "address": s, "total_size": SEG_SIZE,
                         "allocated_size": alloc, "active_size": alloc,
                         "requested_size": sum(kept.get(b["address"], 0) for b in blocks),
                         "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
                         "is_expandable": False, "frames": [], "blocks": blocks})
    return {"segments": segments, "device_traces": [trace], "allocator_settings": {}}


def _entries(n: int) -> int:
    """How many entries snapshot(n) holds (its loop, without building it)."""
    count, i, free = SEGS, 0, SEGS * SLOTS
    while count < n and free:
        if i % 1000 == 999:
            count += 1
            free -= 1
        else:
            count += 3
        i += 1
    return count


_MEASURE = """
import resource, subprocess, sys, time
t = time.monotonic()
p = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
wall = time.monotonic() - t
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"{wall:.3f} {ru.ru_maxrss / 1024:.1f} {p.returncode} {ru.ru_utime + ru.ru_stime:.3f}")
sys.stderr.write(p.stderr.decode()[-2000:])
"""


def child_env(cache: Path, **more: str) -> dict[str, str]:
    """The tools' environment: bytecode cached (in `cache`), as an installed package's
    is, even where PYTHONDONTWRITEBYTECODE is set (this VM sets it: every run would
    compile gputrace again, ~0.5 s)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPATH": str(ROOT), "PYTHONPYCACHEPREFIX": str(cache), **more}


def measure(cmd: list[str], env: dict[str, str]) -> tuple[float, float, int, float]:
    """(wall s, peak MiB, exit status, CPU s) of `cmd` in a fresh process."""
    out = subprocess.run([sys.executable, "-c", _MEASURE, *cmd], capture_output=True,
                         text=True, env=env, check=False)
    wall, rss, rc, cpu = out.stdout.split()
    if int(rc):
        print(out.stderr, file=sys.stderr)
    return float(wall), float(rss), int(rc), float(cpu)


GPUTRACE = """
import shutil, sys
from gputrace import cli
out = sys.argv[2]
shutil.rmtree(out, ignore_errors=True)
rc = cli.main(["import", "torch-snapshot", sys.argv[1], "-o", out])
rc = rc or cli.main(["analyze", out, "--only", "tensors,allocator-pool,allocator-growth,oom",
                     "--format", "json"])
sys.exit(rc)
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--memory-viz", required=True, help="PyTorch's torch/cuda/_memory_viz.py")
    ap.add_argument("--keep", type=Path, help="a folder to keep (and reuse) the snapshots "
                    "in: snapshot-N.pickle")
    ap.add_argument("--tools", default="gputrace,trace,stats",
                    help="which of gputrace, gputrace-python (the importer without its "
                    "compiled reader), trace, stats to run (default: gputrace,trace,stats)")
    args = ap.parse_args()
    rows = []
    cache = Path(tempfile.mkdtemp(prefix="pycache-"))
    with tempfile.TemporaryDirectory() as tmp:  # warm-up, not measured: bytecode cached
        f = Path(tmp) / "small.pickle"
        f.write_bytes(pickle.dumps(snapshot(2000), protocol=4))
        for cmd in ([sys.executable, "-c", GPUTRACE, str(f), str(Path(tmp) / "t")],
                    [sys.executable, args.memory_viz, "trace", str(f)]):
            measure(cmd, child_env(cache))
    for n in args.entries:
        with tempfile.TemporaryDirectory() as tmp:
            f = (args.keep or Path(tmp)) / f"snapshot-{n}.pickle"
            t = time.monotonic()
            if not f.exists():
                snap = snapshot(n)
                with open(f, "wb") as out:
                    pickle.dump(snap, out, protocol=4)
                del snap
            entries = _entries(n)
            made = time.monotonic() - t
            size = f.stat().st_size
            gputrace = [sys.executable, "-c", GPUTRACE, str(f), str(Path(tmp) / "t")]
            for key, tool, cmd, more in (
                ("gputrace", "gputrace import + allocator reports", gputrace, {}),
                ("gputrace-python", "the same, no compiled reader", gputrace,
                 {"GPUTRACE_NO_COMPILED_SCAN": "1"}),
                ("trace", "_memory_viz.py trace",
                 [sys.executable, args.memory_viz, "trace", str(f)], {}),
                ("stats", "_memory_viz.py stats (segsum)",
                 [sys.executable, args.memory_viz, "stats", str(f)], {}),
            ):
                if key not in args.tools.split(","):
                    continue
                wall, rss, rc, cpu = measure(cmd, child_env(cache, **more))
                rows.append({"entries": entries, "pickle_bytes": size, "tool": tool,
                             "wall_s": wall, "cpu_s": cpu, "peak_mib": rss, "rc": rc})
                print(json.dumps(rows[-1]), flush=True)
            print(f"# made in {made:.1f} s", flush=True)


if __name__ == "__main__":
    main()
