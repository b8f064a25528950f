#!/usr/bin/env python3
"""Allocation-call storm for the API layer (issue 4). Run as root from the
repository root:  python3 benchmarks/alloc_storm/run.py [--iters 200000]

One run measures cuMemAlloc_v2 + cuMemFree_v2 pairs through the stand-in
libcuda (no device dir: pure bookkeeping) untraced, under a bare bcc program
with empty uprobe + uretprobe on both symbols (the kernel's floor), and under
`gputrace record -p`; it prints ns per call and the µs each adds per call.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from common import start_recorder  # noqa: E402

SYMS = ("cuMemAlloc_v2", "cuMemFree_v2")
FLOOR = "int on_entry(void *ctx) { return 0; }\nint on_return(void *ctx) { return 0; }\n"


def build(tmp: Path) -> tuple[Path, Path]:
    from tests.standin_cuda.standin_cuda import HERE as STANDIN
    from tests.standin_cuda.standin_cuda import build as build_standin

    lib = build_standin().lib_dir
    exe = tmp / "alloc_storm"
    subprocess.run(["gcc", "-O2", f"-I{STANDIN}", "-o", str(exe), str(HERE / "storm.c"),
                    f"-L{lib}", "-l:libcuda.so.1", f"-Wl,-rpath,{lib}"], check=True)  # fmt: skip
    return exe, lib / "libcuda.so.1"


def parse(out: str) -> float:
    for line in out.splitlines():
        if line.startswith("calls "):
            return float(line.split()[5])
    raise RuntimeError(f"no result in {out!r}")


def env() -> dict[str, str]:
    import os

    e = dict(os.environ)
    e.pop("GPUTRACE_STANDIN_DEVDIR", None)
    return e


def untraced(exe: Path, n: int) -> float:
    return parse(subprocess.run([str(exe), str(n)], capture_output=True, text=True, check=True,
                                env=env()).stdout)  # fmt: skip


def floor(exe: Path, lib: Path, n: int) -> float:
    from gputrace.record import loader

    bpf = loader.import_bcc().BPF(text=FLOOR)
    try:
        for sym in SYMS:
            bpf.attach_uprobe(name=str(lib), sym=sym, fn_name="on_entry")
            bpf.attach_uretprobe(name=str(lib), sym=sym, fn_name="on_return")
        return untraced(exe, n)
    finally:
        bpf.cleanup()


def traced(exe: Path, n: int, tmp: Path) -> dict[str, float]:
    out = tmp / "trace"
    w = subprocess.Popen([str(exe), str(n), "--wait"], text=True, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, env=env())  # fmt: skip
    assert w.stdout is not None and w.stdin is not None
    pid = int(w.stdout.readline().split()[1])
    rec = start_recorder(out, "-p", str(pid)).proc
    w.stdin.write("go\n")
    w.stdin.flush()
    per_call = parse(w.communicate()[0])
    rec.wait()
    from gputrace.tracedir import open_trace

    t = open_trace(out)
    return {"ns_per_call": per_call, "rows": t.rows("cuda_calls"),
            "expected_rows": 2 * n + 2, "drops": sum(t.drops.values())}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=200_000, help="alloc+free pairs")
    ap.add_argument("--repeat", type=int, default=3, help="best of N for each mode")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        exe, lib = build(tmp)
        base = min(untraced(exe, args.iters) for _ in range(args.repeat))
        bare = min(floor(exe, lib, args.iters) for _ in range(args.repeat))
        runs = [traced(exe, args.iters, tmp) for _ in range(args.repeat)]
        best = min(runs, key=lambda r: r["ns_per_call"])
    res = {
        "calls": 2 * args.iters,
        "untraced_ns_per_call": base,
        "floor_ns_per_call": bare,
        "traced_ns_per_call": best["ns_per_call"],
        "floor_us_added_per_call": (bare - base) / 1e3,
        "traced_us_added_per_call": (best["ns_per_call"] - base) / 1e3,
        "gputrace_over_floor_us": (best["ns_per_call"] - bare) / 1e3,
        "rows": best["rows"], "expected_rows": best["expected_rows"], "drops": best["drops"],
    }  # fmt: skip
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
