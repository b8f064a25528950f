#!/usr/bin/env python3
"""Where the probe time goes: each BPF program's run count and mean run time
while a workload runs under `gputrace record` (the kernel's BPF statistics,
enabled through a BPF_ENABLE_STATS descriptor for the run only; it adds two
clock reads to every program run, so compare programs, not absolute totals).
Run as root from the repository root:

    python3 benchmarks/ioctl_storm/progstats.py                 # traced ioctl storm
    python3 benchmarks/ioctl_storm/progstats.py --kind mmap     # untraced work (other.c)
    python3 benchmarks/ioctl_storm/progstats.py --kind alloc --hooks tracepoint  # API layer

`--kind storm` records the storm with -p (every ioctl traced; `--kind uvm`: the same with
UVM_MIGRATE on nvidia-uvm, five fields decoded from user memory); `--kind alloc` records
benchmarks/alloc_storm/storm.c with -p (OPS allocations and frees on the stand-in
libcuda, `--depth` frames below main; CPU ns/op is an allocation's); the other kinds
(benchmarks/untraced/other.c: getpid, null, tty, sock, mmap, fault) run in host
mode, the recorder tracing nothing they do. Needs bpftool.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "untraced"))

from common import build_storm, device_dirs  # noqa: E402
from revision import start_recorder_from, tree_of  # noqa: E402

ALLOC_STORM = HERE.parent / "alloc_storm" / "storm.c"

_BPF_ENABLE_STATS = 32


def enable_stats() -> int:
    """A descriptor that keeps BPF run-time statistics on while it is open."""
    libc = ctypes.CDLL(None, use_errno=True)
    attr = (ctypes.c_uint32 * 4)()  # enable_stats.type = BPF_STATS_RUN_TIME (0)
    nr = 321 if platform.machine() == "x86_64" else 280
    fd = int(libc.syscall(ctypes.c_long(nr), ctypes.c_int(_BPF_ENABLE_STATS), attr,
                          ctypes.c_uint(ctypes.sizeof(attr))))  # fmt: skip
    if fd < 0:
        raise OSError(ctypes.get_errno(), "BPF_ENABLE_STATS")
    return fd


def snapshot() -> dict[int, tuple[str, int, int]]:
    """prog id -> (name, run_cnt, run_time_ns) of every loaded program."""
    out = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    return {p["id"]: (p.get("name", "?"), p.get("run_cnt", 0), p.get("run_time_ns", 0))
            for p in json.loads(out)}  # fmt: skip


def cpu_ns_per_op(out: str) -> float:
    for line in out.splitlines():
        if line.startswith(("calls ", "ops ")):
            return float(line.split()[7])
    raise RuntimeError(f"no result in {out!r}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", default="storm")
    ap.add_argument("--ops", type=int, default=1_000_000)
    ap.add_argument("--hooks", default="tp_btf,tracepoint")
    ap.add_argument("--tree", default="", help="recorder revision or tree (default: here)")
    ap.add_argument("--depth", default="0", help="--kind alloc: frames below main (60, 60b)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        dev, other = device_dirs(tmp)
        if a.kind == "uvm":
            os.environ["STORM_UVM"] = "1"
        storm, alloc = a.kind in ("storm", "uvm"), a.kind == "alloc"
        (tmp / "s").mkdir()
        if alloc:
            from api_runs import build as build_api

            exe = build_api(ALLOC_STORM, tmp / "s" / "alloc_storm")[0]
        else:
            exe = build_storm(HERE / "storm.c" if storm else HERE.parent / "untraced" / "other.c",
                              tmp / "s")  # fmt: skip
        tree = tree_of(a.tree, tmp / "tree")
        argv = ([str(exe), str(dev), str(a.ops)] if storm else
                [str(exe), str(a.ops), "-", a.depth] if alloc else [str(exe), a.kind, str(a.ops)])
        env = {**os.environ, "OTHER_DIR": str(other)}
        base = cpu_ns_per_op(subprocess.run(argv, capture_output=True, text=True, env=env,
                                            check=True).stdout)  # fmt: skip
        print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}; "
              f"{a.kind} untraced: {base:.1f} CPU ns/op")  # fmt: skip
        for mech in a.hooks.split(","):
            os.environ["GPUTRACE_SYSCALL_HOOKS"] = mech
            out = tmp / f"trace-{mech}"
            if storm or alloc:
                wait = [*argv[:2], "--wait", *argv[3:]] if alloc else [*argv, "--wait"]
                w = subprocess.Popen(wait, text=True, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE)  # fmt: skip
                assert w.stdin is not None and w.stdout is not None
                pid = w.stdout.readline().split()[1]
                rec = start_recorder_from(tree, out, "--device-dir", str(dev), "-p", pid)
            else:
                rec = start_recorder_from(tree, out, "--device-dir", str(dev))
            fd = enable_stats()
            try:
                s0 = snapshot()
                if storm or alloc:
                    res, _ = w.communicate("go\n")
                else:
                    res = subprocess.run(argv, capture_output=True, text=True, env=env,
                                         check=True).stdout  # fmt: skip
                s1 = snapshot()
            finally:
                os.close(fd)
                if not (storm or alloc):
                    rec.proc.send_signal(signal.SIGINT)
                rec.wait(120)
            cpu = cpu_ns_per_op(res)
            print(f"\n{mech}: {cpu:.1f} CPU ns/op (+{cpu - base:.1f}); programs that ran "
                  f">= 0.2 times per op (others' programs included):")  # fmt: skip
            rows = []
            for pid_, (name, cnt, ns) in s1.items():
                c0, t0 = s0.get(pid_, (name, 0, 0))[1:]
                dc, dt = cnt - c0, ns - t0
                if dc >= a.ops * 0.2:
                    rows.append((dt / a.ops, name, dc, dt / max(dc, 1)))
            for per_op, name, dc, per_run in sorted(rows, reverse=True):
                print(f"  {name:<40} runs/op {dc / a.ops:5.2f}  ns/run {per_run:7.1f}  "
                      f"ns/op {per_op:7.1f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
