#!/usr/bin/env python3
"""What the native unwinder adds per allocation. Run as root from the
repository root:  python3 benchmarks/unwind_storm/run.py [--iters 200000]

One run measures, as CPU ns per allocation of the storm thread (best of
--repeat): (1) ../alloc_storm/storm.c at depth 0, whose frames all keep frame
pointers (today's frame-pointer walk), and (2) storm_nofp.c, whose allocations
are made two frames deep inside the stand-in caching allocator built without
frame pointers (tests/standin_cuda/caching_alloc.c), where the probe unwinds
those two frames by their tables and then walks frame pointers; each one
untraced, under the uprobe floor (empty programs on the same probes) and under
`gputrace record -p`. Printed: what the floor and gputrace add to each, the
ratio gputrace added / floor added, and the unwinder's extra cost: (2)'s added
minus (1)'s added (the stacks differ by the two table frames).
"""

from __future__ import annotations

import argparse
import json
import subprocess
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

Result = tuple[float, float]


def parse(out: str) -> Result:
    for line in out.splitlines():
        if line.startswith("calls "):
            f = line.split()
            return float(f[7]), float(f[9])
    raise RuntimeError(f"no result in {out!r}")


def build_nofp(exe: Path) -> Path:
    """storm_nofp.c linked against the stand-in caching allocator and libcuda."""
    from tests.standin_cuda.standin_cuda import HERE as STANDIN
    from tests.standin_cuda.standin_cuda import build as build_standin

    lib = build_standin().lib_dir
    subprocess.run(["gcc", "-O2", "-fno-omit-frame-pointer", f"-I{STANDIN}", "-o", str(exe),
                    str(HERE / "storm_nofp.c"), f"-L{lib}", "-lcaching_standin",
                    "-l:libcuda.so.1", f"-Wl,-rpath,{lib}"], check=True)  # fmt: skip
    return exe


def measure(exe: Path, lib: Path, argv: list[str], n: int, k: int, tmp: Path) -> dict[str, Any]:
    def alone() -> Result:
        return parse(run_untraced([str(exe), str(n), *argv]))

    base = min(alone()[0] for _ in range(k))
    floor = min(under_uprobe_floor(lib, alone)[0] for _ in range(k))
    runs = []
    for _ in range(k):
        out, t = run_traced([str(exe), str(n), "--wait", *argv], None, tmp / "trace")
        runs.append({"cpu": parse(out)[0], "rows": t.rows("cuda_calls"),
                     "drops": sum(t.drops.values()), "stacks": t.rows("stacks"),
                     "unwind": t.manifest.get("api", {}).get("unwind", {})})  # fmt: skip
    base = min(base, *(alone()[0] for _ in range(k)))
    return {"untraced_ns": base, "floor_ns": floor, "gputrace_ns": min(r["cpu"] for r in runs),
            "rows": [r["rows"] for r in runs], "expected_rows": 2 * n + 2,
            "drops": [r["drops"] for r in runs], "stack_rows": runs[0]["stacks"],
            "tables": runs[0]["unwind"].get("tables", [])}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=200_000, help="allocations (and frees)")
    ap.add_argument("--repeat", type=int, default=3, help="best of N for each mode")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        fp_exe, lib = build(HERE.parent / "alloc_storm" / "storm.c", tmp / "alloc_storm")
        nofp_exe = build_nofp(tmp / "storm_nofp")
        res = {
            "frame_pointers": measure(fp_exe, lib, ["-", "0"], args.iters, args.repeat, tmp),
            "unwind_tables": measure(nofp_exe, lib, [], args.iters, args.repeat, tmp),
        }
    if args.json:
        print(json.dumps(res, indent=2))
        return
    added = {}
    for name, r in res.items():
        u, f, g = r["untraced_ns"], r["floor_ns"], r["gputrace_ns"]
        added[name] = g - u
        print(
            f"{name:<15} alloc: untraced {u:7.1f}  floor {f:7.1f} (+{f - u:.0f})  "
            f"gputrace {g:7.1f} (+{g - u:.0f})  added/floor-added "
            f"{(g - u) / max(f - u, 1e-9):.2f}  rows {r['rows']} of {r['expected_rows']} "
            f"drops {r['drops']} tables {[t['module'].rsplit('/', 1)[-1] for t in r['tables']]}"
        )
    extra = added["unwind_tables"] - added["frame_pointers"]
    print(
        f"unwinder: +{extra:.0f} ns per allocation over the frame-pointer walk "
        f"({added['unwind_tables'] / max(added['frame_pointers'], 1e-9):.2f}x its added cost)"
    )


if __name__ == "__main__":
    main()
