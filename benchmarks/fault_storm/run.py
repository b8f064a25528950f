#!/usr/bin/env python3
"""Fault storm benchmark for CPU page faults on managed memory. Run as
root from the repository root:  python3 benchmarks/fault_storm/run.py [--mib 1024]

The "driver" is a tmpfs folder holding a sparse 128 TiB regular file named
nvidia-uvm: a MAP_SHARED mapping of it at offset == address is a managed range to
gputrace, and a write to a fresh page costs one cheap shmem fault (the FUSE
stand-in would measure FUSE round trips instead). One run measures, untraced and
under `gputrace record -p`: managed faults (every one recorded) with 1 and 2
concurrent storms, and anonymous faults (every one filtered out in the kernel).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from common import build_storm, start_recorder  # noqa: E402


def fresh_dev(tmp: Path) -> Path:
    """A device dir whose nvidia-uvm has no page allocated yet."""
    dev = tmp / "dev"
    shutil.rmtree(dev, ignore_errors=True)
    dev.mkdir()
    with (dev / "nvidia-uvm").open("wb") as f:
        f.truncate(1 << 47)
    return dev


def parse(out: str) -> tuple[int, float]:
    for line in out.splitlines():
        if line.startswith("faults "):
            w = line.split()
            return int(w[1]), float(w[3])
    raise RuntimeError(f"no result in {out!r}")


def start(storm: Path, dev: Path, mib: int, procs: int, anon: bool) -> list[subprocess.Popen[str]]:
    extra = ["--anon"] if anon else []
    return [subprocess.Popen([str(storm), str(dev), str(mib), "--wait", "--slot", str(i), *extra],
                             text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            for i in range(procs)]  # fmt: skip


def go(ws: list[subprocess.Popen[str]]) -> tuple[list[tuple[int, float]], float]:
    t0 = time.monotonic()
    for w in ws:
        assert w.stdin is not None
        w.stdin.write("go\n")
        w.stdin.flush()
    res = [parse(w.communicate()[0]) for w in ws]
    return res, time.monotonic() - t0


def run(storm: Path, tmp: Path, mib: int, procs: int, anon: bool, traced: bool) -> dict[str, float]:
    dev = fresh_dev(tmp)
    ws = start(storm, dev, mib, procs, anon)
    pids = [int(w.stdout.readline().split()[1]) for w in ws]  # type: ignore[union-attr]
    rec = None
    out = tmp / "trace"
    if traced:
        rec = start_recorder(out, "--device-dir", str(dev),
                             *[a for p in pids for a in ("-p", str(p))]).proc
    res, wall = go(ws)
    faults = sum(n for n, _ in res)
    r: dict[str, float] = {
        "ns_per_fault": sum(ns for _, ns in res) / len(res),
        "faults": faults,
        "faults_per_s": faults / wall,
    }
    if rec is not None:
        assert rec.wait(timeout=300) == 0
        from gputrace.trace.reader import open_trace

        t = open_trace(out)
        r["recorded"] = t.rows("faults")
        r["drops"] = t.drops.get("fault_events", 0)
    return r


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=1024, help="range per storm process")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root")
    with tempfile.TemporaryDirectory(dir="/dev/shm") as td:
        tmp = Path(td)
        storm = build_storm(HERE / "storm.c", tmp)
        res = {}
        for name, procs, anon in (("managed", 1, False), ("managed_2procs", 2, False),
                                  ("anon", 1, True)):  # fmt: skip
            res[name] = {"untraced": run(storm, tmp, a.mib, procs, anon, False),
                         "traced": run(storm, tmp, a.mib, procs, anon, True)}  # fmt: skip
            u, t = res[name]["untraced"], res[name]["traced"]
            res[name]["us_added_per_fault"] = (t["ns_per_fault"] - u["ns_per_fault"]) / 1000
        print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
