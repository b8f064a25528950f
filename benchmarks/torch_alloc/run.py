#!/usr/bin/env python3
"""What the torch_allocator layer adds per tensor allocation. Run as root from the
repository root:

    python3 benchmarks/torch_alloc/run.py [--pairs 20000] [--depth 10] [--repeat 2]

tests/standin_torch/torch_workload.py (--bench) allocates and frees a 4 KiB tensor
--pairs times through the stand-in libc10_cuda.so's NativeCachingAllocator (a cached
block: no segment call, as in a training loop's steady state), from a Python stack
--depth frames deep, and prints the thread's CPU ns per pair (where the probes run).
Columns, one round each, best of --repeat: untraced; the uprobe floor (empty
programs on the layer's probe points: malloc's entry, its `ret`s, free, and
DeviceCachingAllocator's insert_events and free_block, which every free calls); then
`gputrace record -p` with --torch-stacks none, python and full. Frees take no stack,
so what a pair adds over the floor is what its allocation's stack adds.
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
from revision import ROOT, start_recorder_from  # noqa: E402

sys.path.insert(0, str(ROOT))
WORKLOAD = ROOT / "tests" / "standin_torch" / "torch_workload.py"
_FLOOR = "int on_probe(void *ctx) { return 0; }"


def _ns(out: str) -> float:
    return next(float(w[1]) for w in (ln.split() for ln in out.splitlines())
                if len(w) == 2 and w[0] == "bench")  # fmt: skip


def untraced(argv: list[str]) -> float:
    return _ns(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)


def floor(lib: Path, argv: list[str]) -> float:
    """Empty uprobes on every point the layer probes in `lib`."""
    from gputrace.record import loader
    from gputrace.record.torch_allocator import symbols

    e = symbols.find(str(lib))
    bpf = loader.import_bcc().BPF(text=_FLOOR)
    try:
        for addr in (e.malloc, *e.malloc_rets, *(a for a, _ in e.frees),
                     *((e.defer, e.release_block) if e.defer else ())):
            bpf.attach_uprobe(name=str(lib), addr=addr, fn_name="on_probe")
        return untraced(argv)
    finally:
        bpf.cleanup()


def traced(argv: list[str], out: Path, stacks: str) -> tuple[float, dict[str, Any]]:
    from gputrace.trace.reader import open_trace

    w = subprocess.Popen([*argv, "--wait"], text=True, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE)  # fmt: skip
    assert w.stdout is not None and w.stdin is not None
    pid = int(w.stdout.readline().split()[1])
    rec = start_recorder_from(None, out, "-p", str(pid), f"--torch-stacks={stacks}").proc
    w.stdin.write("go\n")
    w.stdin.flush()
    stdout = w.communicate()[0]
    rec.wait()
    t = open_trace(out)
    rows = t.manifest.get("tables", {}).get("allocator_events", {}).get("rows", 0)
    return _ns(stdout), {"rows": rows, "drops": t.manifest.get("drops", {}).get(
        "torch_events", 0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=20000)
    ap.add_argument("--depth", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from tests.standin_torch.standin_torch import build

    lib = build()
    argv = [sys.executable, str(WORKLOAD), str(lib), "--bench", str(args.pairs),
            "--depth", str(args.depth)]  # fmt: skip
    best: dict[str, float] = {}
    facts: dict[str, Any] = {}
    for _ in range(args.repeat):
        got = {"untraced": untraced(argv), "uprobe floor": floor(lib, argv)}
        for stacks in ("none", "python", "full"):
            with tempfile.TemporaryDirectory() as d:
                got[f"stacks={stacks}"], facts[stacks] = traced(argv, Path(d) / "t", stacks)
        for k, v in got.items():
            best[k] = min(best.get(k, v), v)
    if args.json:
        print(json.dumps({"ns_per_pair": best, "traced": facts}))
        return
    base, fl = best["untraced"], best["uprobe floor"]
    print(f"{'':14} {'ns/pair':>9} {'added':>9} {'/ floor':>8}")
    for k, v in best.items():
        added = v - base
        ratio = f"{added / (fl - base):8.2f}" if k != "untraced" and fl > base else ""
        print(f"{k:14} {v:9.0f} {added:9.0f} {ratio}")
    print(f"traced runs (rows of allocator_events, drops): {facts}")


if __name__ == "__main__":
    main()
