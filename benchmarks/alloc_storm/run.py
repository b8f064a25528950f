#!/usr/bin/env python3
"""Allocation-call storm for the API layer. Run as root from the
repository root:  python3 benchmarks/alloc_storm/run.py [--iters 200000]

One run measures cuMemAlloc_v2 and cuMemFree_v2 calls through the stand-in
libcuda (no device dir: pure bookkeeping) untraced, under a bare bcc program
with empty uprobe + uretprobe on both symbols (the kernel's floor), and under
`gputrace record -p`, from a shallow stack and from --depth frames down (a
framework's deep stack: the probe walks it on every allocation). Figures are
the storm thread's CPU ns per call (where the probes run; not inflated by
time slices lost to other processes), best of --repeat. Printed: ns per call
and what the floor and gputrace add, and the ratio each is judged by
(allocations: gputrace added / floor added <= 1.5; frees: at the floor).
--stack-depths 16,32 adds this tree under `record --stack-depth N` (a walk of
at most N frames).
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
from api_runs import Result, build, parse, under_uprobe_floor  # noqa: E402
from api_runs import traced as run_traced  # noqa: E402
from api_runs import untraced as run_untraced  # noqa: E402
from revision import tree_of  # noqa: E402


def best(runs: list[Result]) -> Result:
    return min(r[0] for r in runs), min(r[1] for r in runs)


def untraced(exe: Path, n: int, depth: int | str) -> Result:
    return parse(run_untraced([str(exe), str(n), "-", str(depth)]))


def floor(exe: Path, lib: Path, n: int, depth: int | str) -> Result:
    return under_uprobe_floor(lib, lambda: untraced(exe, n, depth))


def traced(exe: Path, n: int, tmp: Path, depth: int | str, tree: Path | None,
           *flags: str) -> dict[str, Any]:
    out, t = run_traced([str(exe), str(n), "--wait", str(depth)], tree, tmp / "trace", *flags)
    return {"cpu": parse(out), "rows": t.rows("cuda_calls"), "expected_rows": 2 * n + 2,
            "drops": sum(t.drops.values()), "stacks": t.rows("stacks")}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=200_000, help="allocations (and frees)")
    ap.add_argument("--repeat", type=int, default=3, help="best of N for each mode")
    ap.add_argument("--depth", type=int, default=60, help="frames of the deep-stack case")
    ap.add_argument("--big-frames", action="store_true",
                    help="deep-stack frames of 256 bytes each (C++/CPython-like)")  # fmt: skip
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--stack-depths", default="",
                    help="also this tree with `record --stack-depth N`, e.g. 16,32")  # fmt: skip
    ap.add_argument(
        "--before", default="", help="also run the recorder of this revision (or tree directory)"
    )
    ap.add_argument(
        "--after",
        default="",
        help="the recorder to measure: a revision or tree (default: this tree)",
    )
    args = ap.parse_args()
    res: dict[str, Any] = {"calls": 2 * args.iters, "loadavg": os.getloadavg()}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        exe, lib = build(HERE / "storm.c", tmp / "alloc_storm")
        after = tree_of(args.after, tmp / "after")
        before = tree_of(args.before, tmp / "before") if args.before else None
        for depth in (0, f"{args.depth}b" if args.big_frames else args.depth):
            n, k = args.iters, args.repeat
            base = best([untraced(exe, n, depth) for _ in range(k)])
            bare = best([floor(exe, lib, n, depth) for _ in range(k)])
            old = [traced(exe, n, tmp, depth, before) for _ in range(k)] if before else []
            runs = [traced(exe, n, tmp, depth, after) for _ in range(k)]
            rec = best([r["cpu"] for r in runs])
            base = best([base, *[untraced(exe, n, depth) for _ in range(k)]])  # after, too
            res[f"depth_{depth}"] = {
                "untraced_ns": base, "floor_ns": bare, "gputrace_ns": rec,
                "rows": [r["rows"] for r in runs], "expected_rows": runs[0]["expected_rows"],
                "drops": [r["drops"] for r in runs], "stack_rows": runs[0]["stacks"],
            }  # fmt: skip
            for sd in (int(x) for x in args.stack_depths.split(",") if x):
                cut = [traced(exe, n, tmp, depth, after, "--stack-depth", str(sd))
                       for _ in range(k)]  # fmt: skip
                res[f"depth_{depth}"].setdefault("stack_depth_ns", {})[sd] = best(
                    [r["cpu"] for r in cut])
                res[f"depth_{depth}"].setdefault("stack_depth_stack_rows", {})[sd] = cut[0][
                    "stacks"]
            if old:
                res[f"depth_{depth}"]["before_ns"] = best([r["cpu"] for r in old])
                res[f"depth_{depth}"]["before_rows"] = [r["rows"] for r in old]
                res[f"depth_{depth}"]["before_drops"] = [r["drops"] for r in old]
    if args.json:
        print(json.dumps(res, indent=2))
        return
    la = res["loadavg"]
    print(f"{res['calls']} calls per run, CPU ns per call, best of {args.repeat}; "
          f"load average {la[0]:.1f} {la[1]:.1f} {la[2]:.1f}")  # fmt: skip
    for depth in (0, f"{args.depth}b" if args.big_frames else args.depth):
        r = res[f"depth_{depth}"]
        for i, call in enumerate(("alloc", "free")):
            u, f, g = r["untraced_ns"][i], r["floor_ns"][i], r["gputrace_ns"][i]
            print(f"{call:<5} depth {depth!s:>3}: untraced {u:7.1f}  "
                  f"floor {f:7.1f} (+{f - u:.0f})  gputrace {g:7.1f} (+{g - u:.0f})  "
                  f"added/floor-added {(g - u) / max(f - u, 1e-9):.2f}")  # fmt: skip
            if "before_ns" in r:
                b = r["before_ns"][i]
                print(f"{'':<16}before {b:7.1f} (+{b - u:.0f})  added/floor-added "
                      f"{(b - u) / max(f - u, 1e-9):.2f}")  # fmt: skip
            for sd, ns in r.get("stack_depth_ns", {}).items():
                c = ns[i]
                print(f"{'':<6}--stack-depth {sd:>3} {c:7.1f} (+{c - u:.0f})  added/floor-added "
                      f"{(c - u) / max(f - u, 1e-9):.2f}")  # fmt: skip
        print(f"          rows {r['rows']} of {r['expected_rows']}, drops {r['drops']}, "
              f"stack frames {r['stack_rows']}"
              + (f", before rows {r['before_rows']} drops {r['before_drops']}"
                 if "before_rows" in r else ""))  # fmt: skip


if __name__ == "__main__":
    main()
