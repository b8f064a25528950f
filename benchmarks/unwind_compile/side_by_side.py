#!/usr/bin/env python3
"""The cost of the compile's bounds on honest libraries: the same compile
(`cfi.compile_file`, TABLE_ROWS) of two source trees, side by side. Run from the
repository root (no root needed):

    git archive <before> gputrace | tar -x -C /tmp/before
    python3 benchmarks/unwind_compile/side_by_side.py /tmp/before . [--rounds 3] [LIBRARY ...]

Each round compiles every library once per tree, each tree in a fresh interpreter, the
trees alternating (a busy shared host slows both alike); a library's figure is its best
CPU seconds (process_time: the compile's own, not the host's load) over the rounds.
The two trees must give the same result (the same rows, or the same refusal, less its
wording): the table says so.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run import DEFAULT, LIBDIR

ONE = """
import hashlib, json, sys, time
from gputrace.record.unwind import cfi, tables
out = {}
for lib in sys.argv[1:]:
    t = time.process_time()
    try:
        got = cfi.compile_file(lib, tables.TABLE_ROWS)
        gave = hashlib.sha256(repr([r.pack() for r in got.rows]).encode()).hexdigest()[:12]
        gave = f"{len(got.rows)} rows ({gave})"
    except cfi.CfiError as e:
        gave = "refused" if "unwind rows" in str(e) else str(e).split(": ", 1)[-1]
    out[lib] = (time.process_time() - t, gave)
print(json.dumps(out))
"""


def run(tree: str, libs: list[str]) -> dict[str, tuple[float, str]]:
    r = subprocess.run([sys.executable, "-c", ONE, *libs], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": os.path.abspath(tree)}, check=True)
    return {k: (float(v[0]), str(v[1])) for k, v in json.loads(r.stdout).items()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("libs", nargs="*")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    libs = a.libs or [p for n in DEFAULT if os.path.exists(p := f"{LIBDIR}/{n}")]
    best: dict[str, dict[str, float]] = {"before": {}, "after": {}}
    gave: dict[str, dict[str, str]] = {"before": {}, "after": {}}
    for _ in range(a.rounds):
        for name, tree in (("before", a.before), ("after", a.after)):
            for lib, (cpu, what) in run(tree, libs).items():
                best[name][lib] = min(best[name].get(lib, cpu), cpu)
                gave[name][lib] = what
    print("| library | before (CPU s) | after (CPU s) | after/before | same result |")
    print("|---|---|---|---|---|")
    tb = ta = 0.0
    for lib in libs:
        b, x = best["before"][lib], best["after"][lib]
        tb, ta = tb + b, ta + x
        same = "yes" if gave["before"][lib] == gave["after"][lib] else (
            f"no: {gave['before'][lib]} / {gave['after'][lib]}")
        print(f"| {os.path.basename(lib)} | {b:.2f} | {x:.2f} | {x / b:.3f} | {same} "
              f"({gave['after'][lib]}) |")
    print(f"| all | {tb:.2f} | {ta:.2f} | {ta / tb:.3f} | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
