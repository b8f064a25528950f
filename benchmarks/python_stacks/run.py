#!/usr/bin/env python3
"""What Python frames add per allocation. Run as root from the repository root:

    python3 benchmarks/python_stacks/run.py [--loops 20000] [--depths 10,30,50]
        [--repeat 3] [--before main] [--python /root/.pyenv/versions/3.12.1/bin/python]

tests/standin_cuda/py_workload.py (--bench) allocates and frees 64 KiB through the
stand-in libcuda (ctypes) --loops times from a Python stack of each --depths
frames, in one process, and prints the thread's CPU ns per pair (where the probes
run; frees walk no stack, so what a pair adds is what its allocation adds).
Columns, one run, round by round (same load): untraced; the uprobe floor (empty
uprobe + uretprobe programs on both symbols); `gputrace record -p` of --before
(default: the branch `main`, today's native walk only) and of this tree (native
walk + Python frames). Best of --repeat; rows and drops of every traced run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "untraced"))
from api_runs import env, under_uprobe_floor  # noqa: E402
from revision import ROOT, start_recorder_from, tree_of  # noqa: E402

WORKLOAD = ROOT / "tests" / "standin_cuda" / "py_workload.py"


def parse(out: str) -> dict[int, float]:
    """{depth: CPU ns per pair} from the workload's `bench D NS` lines."""
    return {int(w[1]): float(w[2]) for w in (ln.split() for ln in out.splitlines())
            if len(w) == 3 and w[0] == "bench"}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loops", type=int, default=20000)
    ap.add_argument("--depths", default="10,30,50")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--before", default="main", help="today's recorder: a revision or tree")
    ap.add_argument("--python", default="/root/.pyenv/versions/3.12.1/bin/python")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from tests.standin_cuda.standin_cuda import build

    lib = build().libcuda
    argv = [args.python, str(WORKLOAD), str(lib), "--bench", args.depths,
            "--loops", str(args.loops)]  # fmt: skip
    pairs = (100 + args.loops) * len(args.depths.split(","))

    def untraced() -> dict[int, float]:
        return parse(subprocess.run(argv, capture_output=True, text=True, check=True,
                                    env=env()).stdout)  # fmt: skip

    def traced(tree: Path | None, out: Path) -> dict[str, Any]:
        from gputrace.trace.reader import open_trace

        w = subprocess.Popen([*argv, "--wait"], text=True, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, env=env())  # fmt: skip
        assert w.stdout is not None and w.stdin is not None
        pid = int(w.stdout.readline().split()[1])
        rec = start_recorder_from(tree, out, "-p", str(pid)).proc
        w.stdin.write("go\n")
        w.stdin.flush()
        lines = []
        for line in w.stdout:
            lines.append(line)
            if line == "ALLOCATED\n":
                break
        rec.send_signal(2)  # SIGINT: stop while the workload lives (frames are named)
        rec.wait()
        w.stdin.write("bye\n")
        w.stdin.flush()
        w.communicate()
        t = open_trace(out)
        py = (t.manifest.get("api") or {}).get("python") or {}
        return {"ns": parse("".join(lines)), "rows": t.rows("cuda_calls"),
                "drops": sum(t.drops.values()), "python_frames": py.get("frames")}

    res: dict[str, Any] = {"loadavg": os.getloadavg(), "pairs_per_run": pairs, "runs": []}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        before = tree_of(args.before, tmp / "before")
        for _ in range(args.repeat):
            res["runs"].append({
                "untraced": untraced(), "floor": under_uprobe_floor(lib, untraced),
                "before": traced(before, tmp / "b"), "after": traced(None, tmp / "a"),
            })  # fmt: skip
    if args.json:
        print(json.dumps(res, indent=2))
        return
    runs = res["runs"]
    print(f"{pairs} alloc+free pairs per run, CPU ns per pair, best of {args.repeat}; "
          f"load {res['loadavg'][0]:.1f}")
    for dep in (int(x) for x in args.depths.split(",")):
        u = min(r["untraced"][dep] for r in runs)
        f = min(r["floor"][dep] for r in runs)
        b = min(r["before"]["ns"][dep] for r in runs)
        a = min(r["after"]["ns"][dep] for r in runs)
        print(f"depth {dep:>3}: untraced {u:7.1f}  floor {f:7.1f} (+{f - u:.0f})  "
              f"before {b:7.1f} (+{b - u:.0f})  after {a:7.1f} (+{a - u:.0f})  "
              f"Python frames add {a - b:+.0f}")
    for r in runs:
        print(f"rows before {r['before']['rows']} after {r['after']['rows']} (of "
              f"{pairs * 2 + 5} calls expected), drops {r['before']['drops']}/"
              f"{r['after']['drops']}, Python frames named {r['after']['python_frames']}")


if __name__ == "__main__":
    main()
