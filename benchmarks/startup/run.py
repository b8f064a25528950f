"""`gputrace record -o T -- true`, side by side in one run: the tree of `--before REV`
(from `git archive`) and this tree, each on an empty BPF object cache (cold: compiled
in child processes, then loaded; a tree from before the cache compiles in the
recorder) and on a filled one (warm); `--no-cache` adds this tree with the caches
off. Rounds are interleaved (the rows see the same machine load); each cell is the
median of the rounds. Wall, user and system CPU (the recorder and the processes it
waited for), peak RSS of the largest of them, and the recorder's peak PSS (sampled
from /proc/PID/smaps_rollup every 20 ms: a page mapped twice, as libbpf maps each
ring buffer's data, counts once; a shared library's pages are split among the
processes that map them). As root:

    PYTHONPATH=$PWD python3 benchmarks/startup/run.py --before 1e35f42 --rounds 2
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def _peak_pss(pid: int, stop: threading.Event, out: list[float]) -> None:
    while not stop.is_set():
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        out.append(int(line.split()[1]) / 1024)
        except (OSError, ValueError):
            pass
        stop.wait(0.02)


def one(tree: Path, env: dict[str, str], extra: list[str], out: Path) -> tuple[float, ...]:
    e = {**os.environ, **env, "PYTHONPATH": str(tree)}
    shutil.rmtree(out, ignore_errors=True)  # an older tree cannot replace a newer trace
    t = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "gputrace.cli", "record", "-o", str(out),
                          "--force", *extra, "--", "true"], cwd=tree, env=e,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    stop, pss = threading.Event(), [0.0]
    sampler = threading.Thread(target=_peak_pss, args=(p.pid, stop, pss), daemon=True)
    sampler.start()
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    stop.set()
    sampler.join()
    err = p.stderr.read().decode() if p.stderr else ""
    if status != 0:
        raise SystemExit(f"record failed ({status}): {err[-2000:]}")
    return (wall, ru.ru_utime, ru.ru_stime, ru.ru_maxrss / 1024, max(pss),
            os.getloadavg()[0])  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", default=None, help="git revision of the 'before' rows")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-cache", action="store_true", help="add this tree with --no-cache")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gt-startup-bench-"))
    trees = {"now": ROOT}
    if a.before:
        before = work / "before"
        before.mkdir()
        subprocess.run(f"git -C {ROOT} archive {a.before} | tar -x -C {before}", shell=True,
                       check=True)  # fmt: skip
        trees = {f"before ({a.before})": before, **trees}
    # name: (tree, cache directory: None for the tree's default, "cold" for an
    # empty one each round, else a path filled before the rounds; extra arguments)
    rows: dict[str, tuple[Path, str | None, list[str]]] = {}
    for label, tree in trees.items():
        rows[f"{label}, cold cache"] = (tree, "cold", [])
        rows[f"{label}, warm cache"] = (tree, str(work / f"warm-{len(rows)}"), [])
    if a.no_cache:
        rows["now, --no-cache"] = (ROOT, None, ["--no-cache"])
    for tree, cache, extra in rows.values():
        if cache not in (None, "cold"):  # fill the warm ones
            one(tree, {"GPUTRACE_BPF_CACHE": cache}, extra, work / "T")
    got: dict[str, list[tuple[float, ...]]] = {k: [] for k in rows}
    for r in range(a.rounds):
        for i, (name, (tree, cache, extra)) in enumerate(rows.items()):
            env = {} if cache is None else {"GPUTRACE_BPF_CACHE": cache}
            if cache == "cold":
                env = {"GPUTRACE_BPF_CACHE": str(work / f"cold-{r}-{i}")}
            got[name].append(one(tree, env, extra, work / "T"))
    print(f"{'':30} {'wall s':>8} {'user s':>8} {'sys s':>8} {'CPU s':>7} {'RSS MB':>7} "
          f"{'PSS MB':>7} {'load':>5}  (median of {a.rounds}; wall min..max)")  # fmt: skip
    for name, runs in got.items():
        med = [statistics.median(c) for c in zip(*runs, strict=True)]
        walls = [x[0] for x in runs]
        print(f"{name:30} {med[0]:8.2f} {med[1]:8.2f} {med[2]:8.2f} {med[1] + med[2]:7.2f} "
              f"{med[3]:7.0f} {med[4]:7.0f} {med[5]:5.1f}  "
              f"({min(walls):.2f}..{max(walls):.2f})")  # fmt: skip
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
