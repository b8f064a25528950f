#!/usr/bin/env python3
"""Run time per call of the API programs themselves (kernel.bpf_stats_enabled):
the allocation's entry program (where the Python walk runs) and the uretprobe,
for a recorder tree, while py_workload.py --bench runs one depth. Root, from the
repository root:

    python3 benchmarks/python_stacks/bpf_stats.py [--before main] [--depths 10,30,50]

Prints `TREE depth D PROGRAM calls ns/call` for both trees (--before and this one).
Programs of other recorders on the host are left out (only runs of this size count).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "untraced"))
from revision import ROOT, start_recorder_from, tree_of  # noqa: E402

WORKLOAD = ROOT / "tests" / "standin_cuda" / "py_workload.py"
PROGS = ("uprobe_cuMemAlloc_v2", "uretprobe_cuda")


def one(tree: Path | None, depth: int, loops: int, python: str, out: Path) -> dict[str, float]:
    from tests.standin_cuda.standin_cuda import build

    w = subprocess.Popen([python, str(WORKLOAD), str(build().libcuda), "--wait", "--bench",
                          str(depth), "--loops", str(loops)], text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
    assert w.stdin is not None and w.stdout is not None
    pid = int(w.stdout.readline().split()[1])
    rec = start_recorder_from(tree, out, "-p", str(pid)).proc
    w.stdin.write("go\n")
    w.stdin.flush()
    for line in w.stdout:
        if line == "ALLOCATED\n":
            break
    progs = json.loads(subprocess.run(["bpftool", "prog", "show", "-j"], capture_output=True,
                                      text=True, check=True).stdout)  # fmt: skip
    got = {p["name"]: p["run_time_ns"] / p["run_cnt"] for p in progs
           if p.get("name") in PROGS and p.get("run_cnt", 0) >= loops}  # fmt: skip
    rec.send_signal(2)
    rec.wait()
    w.stdin.write("bye\n")
    w.stdin.flush()
    w.communicate()
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", default="main")
    ap.add_argument("--depths", default="10,30,50")
    ap.add_argument("--loops", type=int, default=20000)
    ap.add_argument("--python", default="/root/.pyenv/versions/3.12.1/bin/python")
    args = ap.parse_args()
    old = Path("/proc/sys/kernel/bpf_stats_enabled").read_text().strip()
    Path("/proc/sys/kernel/bpf_stats_enabled").write_text("1")
    try:
        with tempfile.TemporaryDirectory() as d:
            before = tree_of(args.before, Path(d) / "before")
            for depth in (int(x) for x in args.depths.split(",")):
                for k, (name, tree) in enumerate(((args.before, before), ("this tree", None))):
                    # a trace directory of its own: trees of different schema versions
                    # never overwrite each other's
                    got = one(tree, depth, args.loops, args.python, Path(d) / f"t{depth}-{k}")
                    for prog, ns in sorted(got.items()):
                        print(f"{name} depth {depth} {prog} {ns:.1f} ns/call")
    finally:
        Path("/proc/sys/kernel/bpf_stats_enabled").write_text(old)


if __name__ == "__main__":
    main()
