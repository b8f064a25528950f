#!/usr/bin/env python3
"""What the recorder costs the work it does NOT record (target: near zero). Run as
root from the repository root:  python3 benchmarks/untraced/run.py [--ops 100000]

Host mode sees every process, so every ioctl, mmap and page fault on the host
passes the probes. `other.c` times, inside the process, one kind of operation the
recorder must ignore: ioctls on a mknod copy of /dev/null outside the device dir
(`null`), on a pseudo-terminal (`tty`) and on a UDP socket (`sock`), mmap+munmap
of a regular file (`mmap`), write faults on private anonymous pages (`fault`),
and getpid (`getpid`, a syscall no probe looks at). The `known:` rows are the same
from a process that holds an open NVIDIA fd (the recorder tracks it, so its other
work goes through the per-fd lookup). Every kind runs --rounds times untraced,
then under `gputrace record` in host mode with each hook mechanism (tp_btf, and
the syscalls:* tracepoints it falls back to; GPUTRACE_SYSCALL_HOOKS), then
untraced again. A column `floor:MECH` runs the same work under programs that
return 0 at once on the same hook points (floor.py): the kernel's dispatch
cost, which no filter can remove; a column `before:MECH` runs the recorder of
revision --before (revision.py), so before and after share one run. The
figure is the calling thread's CPU time per operation (the probes run in its
context; time slices lost to the recorder and other processes on a shared
2-core VM are not counted), the best run of each is kept, and the added ns
per operation is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from common import build_storm, device_dirs  # noqa: E402

sys.path.insert(0, str(HERE))
from revision import bpf_stats, other_tracers, start_recorder_from, tree_of, under_floor  # noqa: E402

KINDS = ("getpid", "null", "tty", "sock", "mmap", "fault")
KNOWN = ("null", "fault")  # also run from a process with an NVIDIA fd open


def run_kind(exe: Path, kind: str, n: int, other: Path, dev: Path | None) -> float:
    argv = [str(exe), kind, str(n)] + ([str(dev)] if dev else [])
    out = subprocess.run(argv, capture_output=True, text=True, check=True,
                         env={**os.environ, "OTHER_DIR": str(other)}).stdout  # fmt: skip
    for line in out.splitlines():
        if line.startswith("ops "):
            return float(line.split()[7])  # CPU ns per op: see other.c
    raise RuntimeError(f"no result in {out!r}")


def one_pass(exe: Path, n: int, other: Path, dev: Path,
             kinds: tuple[str, ...] = KINDS) -> dict[str, float]:  # fmt: skip
    res = {k: run_kind(exe, k, n, other, None) for k in kinds}
    res.update({f"known:{k}": run_kind(exe, k, n, other, dev) for k in KNOWN if k in kinds})
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--kinds", default=",".join(KINDS), help="which kinds (default: all)")
    ap.add_argument("--quiet-wait", type=float, default=0.0,
                    help="before each round, wait up to this many seconds for other "
                         "tracers (gputrace record, floor.py) to end")  # fmt: skip
    ap.add_argument(
        "--hooks",
        default="floor:tracepoint,tracepoint,floor:tp_btf,tp_btf",
        help="columns: MECH, floor:MECH or before:MECH (MECH: tracepoint, tp_btf)",
    )
    ap.add_argument(
        "--before", default="HEAD", help="before: columns run this revision (or tree directory)"
    )
    ap.add_argument(
        "--after",
        default="",
        help="the other recorder columns run this revision or tree (default: here)",
    )
    a = ap.parse_args()
    hooks = a.hooks.split(",")
    kinds = tuple(k for k in KINDS if k in a.kinds.split(","))
    base: dict[str, list[float]] = {}
    rec: dict[str, dict[str, list[float]]] = {h: {} for h in hooks}
    ran: dict[str, str] = {}
    others: dict[str, int] = {}  # column -> other tracers seen while it ran
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        dev, other = device_dirs(tmp)
        exe = build_storm(HERE / "other.c", tmp)

        def measure(into: dict[str, list[float]], col: str = "untraced") -> None:
            for _ in range(a.rounds):
                deadline = time.monotonic() + a.quiet_wait
                while other_tracers() and time.monotonic() < deadline:
                    time.sleep(1)
                seen = other_tracers()
                for k, v in one_pass(exe, a.ops, other, dev, kinds).items():
                    into.setdefault(k, []).append(v)
                others[col] = max(others.get(col, 0), seen, other_tracers())

        uses_before = any(h.startswith("before:") for h in hooks)
        before = tree_of(a.before, tmp / "before") if uses_before else None
        after = tree_of(a.after, tmp / "after")
        measure(base)
        for h in hooks:
            kind, _, mech = h.rpartition(":")
            if kind == "floor":
                under_floor(mech, partial(measure, rec[h], h))
                ran[h] = f"null programs ({mech})"
                continue
            out = tmp / f"trace-{h.replace(':', '-')}"
            os.environ["GPUTRACE_SYSCALL_HOOKS"] = mech
            tree = before if kind == "before" else after
            recp = start_recorder_from(tree, out, "--device-dir", str(dev))  # host mode
            try:
                measure(rec[h], h)
            finally:
                recp.proc.send_signal(signal.SIGINT)
                recp.wait(120)
            m = json.loads((out / "manifest.json").read_text())
            ran[h] = str(m.get("syscall_hooks", {}).get("mechanism", "tracepoint (no field)"))
        measure(base)  # untraced again: the best of before and after
    load = os.getloadavg()
    hooks = list(dict.fromkeys(hooks))  # a column named twice ran twice: best of both
    rows = {k: {"untraced_ns": min(base[k]),
                **{f"{h}_ns": min(rec[h][k]) for h in hooks},
                **{f"{h}_added_ns": min(rec[h][k]) - min(base[k]) for h in hooks}}
            for k in base}  # fmt: skip
    if a.json:
        print(json.dumps({"ops": a.ops, "rounds": a.rounds, "hooks_ran": ran,
                          "loadavg": load, "bpf_stats_enabled": bpf_stats(),
                          "other_tracers": others, "kinds": rows}, indent=2))  # fmt: skip
        return 0
    print(f"{a.ops} ops x {a.rounds} rounds, best of rounds; hooks that ran: "
          + ", ".join(f"{h} -> {m}" for h, m in ran.items())
          + f"; load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}"
          + f"; kernel.bpf_stats_enabled={bpf_stats()}")  # fmt: skip
    if any(others.values()):
        print("warning: other tracers (gputrace record, floor.py) ran during: "
              + ", ".join(f"{c} ({n})" for c, n in others.items() if n))  # fmt: skip
    head = "".join(f" {h + ' ns':>14} {'added':>7} {'ratio':>5}" for h in hooks)
    print(f"{'kind':<13} {'untraced ns':>11}{head}")
    for k, r in rows.items():
        cells = "".join(f" {r[f'{h}_ns']:14.1f} {r[f'{h}_added_ns']:+7.1f} "
                        f"{r[f'{h}_ns'] / r['untraced_ns']:5.2f}" for h in hooks)  # fmt: skip
        print(f"{k:<13} {r['untraced_ns']:11.1f}{cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
