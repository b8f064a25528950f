"""`gputrace record -o T -- true`, side by side in one run: the tree before the BPF
object cache (`--before REV`, from `git archive`), this tree with `--no-cache`, this
tree on an empty cache (cold: compiled in child processes, then loaded) and on a
filled one (warm). Rounds are interleaved (the rows see the same machine load);
each cell is the median of the rounds. Wall, user and system CPU (the recorder and
the processes it waited for), peak RSS of the largest of them. As root:

    PYTHONPATH=$PWD python3 benchmarks/startup/run.py --before b4753af --rounds 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def one(tree: Path, env: dict[str, str], extra: list[str], out: Path) -> tuple[float, ...]:
    e = {**os.environ, **env, "PYTHONPATH": str(tree)}
    t = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "gputrace.cli", "record", "-o", str(out),
                          "--force", *extra, "--", "true"], cwd=tree, env=e,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    err = p.stderr.read().decode() if p.stderr else ""
    if status != 0:
        raise SystemExit(f"record failed ({status}): {err[-2000:]}")
    return wall, ru.ru_utime, ru.ru_stime, ru.ru_maxrss / 1024, os.getloadavg()[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", default=None, help="git revision of the 'before' row")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gt-startup-bench-"))
    rows: dict[str, tuple[Path, dict[str, str], list[str]]] = {}
    if a.before:
        before = work / "before"
        before.mkdir()
        subprocess.run(f"git -C {ROOT} archive {a.before} | tar -x -C {before}", shell=True,
                       check=True)  # fmt: skip
        rows[f"before ({a.before})"] = (before, {}, [])
    warm_dir = work / "warm-cache"
    rows["now, --no-cache"] = (ROOT, {}, ["--no-cache"])
    rows["now, cold cache"] = (ROOT, {}, [])  # its own empty directory each round
    rows["now, warm cache"] = (ROOT, {"GPUTRACE_BPF_CACHE": str(warm_dir)}, [])
    one(ROOT, rows["now, warm cache"][1], [], work / "T")  # fill the warm one
    got: dict[str, list[tuple[float, ...]]] = {k: [] for k in rows}
    for r in range(a.rounds):
        for name, (tree, env, extra) in rows.items():
            if name == "now, cold cache":
                cold = work / f"cold-{r}"
                env = {"GPUTRACE_BPF_CACHE": str(cold)}
            got[name].append(one(tree, env, extra, work / "T"))
    print(f"{'':24} {'wall s':>8} {'user s':>8} {'sys s':>8} {'CPU s':>7} {'RSS MB':>7} "
          f"{'load':>5}  (median of {a.rounds}; wall min..max)")  # fmt: skip
    for name, runs in got.items():
        med = [statistics.median(c) for c in zip(*runs, strict=True)]
        walls = [x[0] for x in runs]
        print(f"{name:24} {med[0]:8.2f} {med[1]:8.2f} {med[2]:8.2f} {med[1] + med[2]:7.2f} "
              f"{med[3]:7.0f} {med[4]:5.1f}  ({min(walls):.2f}..{max(walls):.2f})")  # fmt: skip
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
