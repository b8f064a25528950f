#!/usr/bin/env python3
"""An allocation-heavy program under `gputrace record` (API target:
<= 2 % slower per iteration). Run as root from the repository root:

    python3 benchmarks/alloc_loop/run.py [--iters 400] [--pairs 13] [--depth 44]

loop.c models the uncached PyTorch loop of the H200 capture (every tensor a
cudaMalloc/cudaFree, ~1.3 ms per iteration, 203,676 cuMem* calls in 10.4 s:
~13 allocations and their frees per iteration) on the stand-in libcuda: each
iteration allocates --pairs times from stacks --depth..--depth+3 frames deep
(frame pointers kept), does a fixed amount of CPU work between the calls
(calibrated once, untraced, to --iter-us per iteration; the same in every
mode), then frees. Columns, run interleaved round by round (same load):
untraced; the floor (a bare bcc program with empty uprobe + uretprobe on both
symbols: what the kernel's uprobes cost whatever a tracer does); `gputrace
record -p` of --before (a revision or tree) and of this tree (or --after);
and this tree with each `--stack-depth` given. Figures: the loop thread's CPU
time per iteration (where the probes run), best of --repeat; printed with the
% slower than untraced and the part of it the floor alone costs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "untraced"))
from api_runs import build, under_uprobe_floor  # noqa: E402
from api_runs import traced as run_traced  # noqa: E402
from api_runs import untraced as run_untraced  # noqa: E402
from revision import tree_of  # noqa: E402


def parse(out: str) -> float:
    """CPU ns per iteration from loop.c's result line."""
    for line in out.splitlines():
        if line.startswith("iters "):
            return float(line.split()[3])
    raise RuntimeError(f"no result in {out!r}")


class Loop:
    def __init__(self, exe: Path, lib: Path, iters: int, depth: int, pairs: int) -> None:
        self.exe, self.lib, self.iters, self.depth, self.pairs = exe, lib, iters, depth, pairs
        self.work = 0

    def argv(self, iters: int | None = None, work: int | None = None) -> list[str]:
        return [str(self.exe), str(iters or self.iters), str(self.work if work is None else work),
                str(self.depth), str(self.pairs)]  # fmt: skip

    def calibrate(self, iter_us: float) -> None:
        """Work units that make an untraced iteration take ~iter_us of CPU."""
        probe = 1_000_000
        def run(w: int) -> float:
            argv = self.argv(50, w)
            return min(parse(run_untraced(argv)) for _ in range(3))
        bare, full = run(0), run(probe)
        per_unit = max(full - bare, 1.0) / probe
        self.work = max(0, int((iter_us * 1000 - bare) / per_unit))

    def untraced(self) -> float:
        return parse(run_untraced(self.argv()))

    def floor(self) -> float:
        return under_uprobe_floor(self.lib, self.untraced)

    def traced(self, tmp: Path, tree: Path | None, *flags: str) -> dict[str, Any]:
        out, t = run_traced([*self.argv(), "--wait"], tree, tmp / "trace", *flags)
        return {"cpu": parse(out), "rows": t.rows("cuda_calls"), "drops": sum(t.drops.values()),
                "stacks": t.rows("stacks"),
                "stack_depth": t.manifest.get("api", {}).get("stack_depth")}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=400, help="iterations per run")
    ap.add_argument("--pairs", type=int, default=13, help="allocations (and frees) per iteration")
    ap.add_argument("--depth", type=int, default=44, help="frames below main of the loop")
    ap.add_argument("--iter-us", type=float, default=1300.0, help="untraced CPU us per iteration")
    ap.add_argument("--repeat", type=int, default=3, help="rounds (best of N per column)")
    ap.add_argument("--stack-depths", default="",
                    help="also this tree with `record --stack-depth N`, e.g. 16,32")  # fmt: skip
    ap.add_argument("--before", default="", help="also the recorder of this revision or tree")
    ap.add_argument("--after", default="", help="the recorder measured (default: this tree)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    depths = [int(d) for d in args.stack_depths.split(",") if d]
    res: dict[str, Any] = {"loadavg_start": os.getloadavg(), "iters": args.iters,
                           "pairs": args.pairs, "depth": args.depth}  # fmt: skip
    cols: dict[str, list[float]] = {}
    facts: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        exe, lib = build(HERE / "loop.c", tmp / "alloc_loop")
        loop = Loop(exe, lib, args.iters, args.depth, args.pairs)
        loop.calibrate(args.iter_us)
        res["work_units"] = loop.work
        after = tree_of(args.after, tmp / "after")
        before = tree_of(args.before, tmp / "before") if args.before else None
        runs: list[tuple[str, Any]] = [("untraced", loop.untraced), ("floor", loop.floor)]
        if args.before:
            runs.append(("before", lambda: loop.traced(tmp, before)))
        runs.append(("gputrace", lambda: loop.traced(tmp, after)))
        for sd in depths:
            flag = ("--stack-depth", str(sd))
            runs.append((f"gputrace --stack-depth {sd}",
                         lambda flag=flag: loop.traced(tmp, after, *flag)))  # fmt: skip
        for _ in range(args.repeat):
            for name, fn in runs:
                r = fn()
                if isinstance(r, dict):
                    facts.setdefault(name, {"rows": [], "drops": [], "stacks": [],
                                            "stack_depth": r["stack_depth"]})  # fmt: skip
                    for k in ("rows", "drops", "stacks"):
                        facts[name][k].append(r[k])
                    r = r["cpu"]
                cols.setdefault(name, []).append(r)
    res["loadavg_end"] = os.getloadavg()
    res["cpu_ns_per_iter"] = cols
    res["facts"] = facts
    if args.json:
        print(json.dumps(res, indent=2))
        return
    best = {k: min(v) for k, v in cols.items()}
    u, f = best["untraced"], best["floor"]
    calls = 2 * args.pairs
    la0, la1 = res["loadavg_start"], res["loadavg_end"]
    print(f"{args.iters} iterations x {args.pairs} allocations + {args.pairs} frees, stacks "
          f"{args.depth}..{args.depth + 3} frames below main, {loop.work} work units; "
          f"CPU us per iteration, best of {args.repeat}; "
          f"load average {la0[0]:.1f} -> {la1[0]:.1f}")  # fmt: skip
    for name, g in best.items():
        line = f"{name:<28} {g / 1000:9.1f} us"
        if name != "untraced":
            line += (f"  +{(g - u) / 1000:7.1f} us  {100 * (g - u) / u:+6.2f} %  "
                     f"(+{(g - u) / calls:6.0f} ns per call)")  # fmt: skip
        if name not in ("untraced", "floor") and g > u:
            line += f"  floor share {100 * max(f - u, 0) / (g - u):3.0f} %"
        print(line)
    for name, fa in facts.items():
        print(f"  {name}: rows {fa['rows']} (expected {args.iters * calls + 2} each), drops "
              f"{fa['drops']}, stack frames {fa['stacks']}, manifest stack_depth "
              f"{fa['stack_depth']}")  # fmt: skip


if __name__ == "__main__":
    main()
