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

The other design, a copy of the top of the user stack unwound after the fact
(perf --call-graph dwarf), is measured as a prototype of its probe side only:
(2) under a bare program whose uretprobe copies --copy-bytes of user stack and
the registers into a ring buffer that a thread drains and discards (its
unwinding in user space would come on top).
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
from api_runs import Result, build, parse, under_uprobe_floor  # noqa: E402
from api_runs import traced as run_traced  # noqa: E402
from api_runs import untraced as run_untraced  # noqa: E402

_COPY = """
#include <uapi/linux/ptrace.h>
struct copy { u64 ip, sp, bp; u8 stack[COPY_BYTES]; };
BPF_RINGBUF_OUTPUT(copies, 16384);
int on_entry(void *ctx) { return 0; }
int on_free_return(void *ctx) { return 0; }
int on_return(struct pt_regs *ctx)
{
    struct copy *c = copies.ringbuf_reserve(sizeof(struct copy));
    if (!c)
        return 0;
    c->ip = PT_REGS_IP(ctx), c->sp = PT_REGS_SP(ctx), c->bp = PT_REGS_FP(ctx);
    if (bpf_probe_read_user(c->stack, COPY_BYTES, (void *)c->sp))
        c->sp = 0;
    copies.ringbuf_submit(c, 0);
    return 0;
}
"""


def under_stack_copy(lib: Path, work: Any, nbytes: int) -> tuple[Result, int]:
    """`work()` with the copy design's probe on the storm's calls: (its result,
    records drained)."""
    import threading

    from api_runs import SYMS

    from gputrace.record import loader

    bpf = loader.import_bcc().BPF(text=_COPY, cflags=[f"-DCOPY_BYTES={int(nbytes)}"])
    got = [0]

    def cb(_ctx: Any, _data: Any, _size: int) -> int:
        got[0] += 1
        return 0

    bpf["copies"].open_ring_buffer(cb)
    stop = threading.Event()

    def drain() -> None:
        while not stop.is_set():
            bpf.ring_buffer_poll(50)
        bpf.ring_buffer_consume()

    t = threading.Thread(target=drain)
    try:
        for sym in SYMS:  # frees take no stack, in either design
            ret = "on_return" if sym == "cuMemAlloc_v2" else "on_free_return"
            bpf.attach_uprobe(name=str(lib), sym=sym, fn_name="on_entry")
            bpf.attach_uretprobe(name=str(lib), sym=sym, fn_name=ret)
        t.start()
        out = work()
    finally:
        stop.set()
        if t.is_alive():
            t.join()
        bpf.cleanup()
    return out, got[0]



def build_nofp(exe: Path) -> Path:
    """storm_nofp.c linked against the stand-in caching allocator and libcuda."""
    from tests.standin_cuda.standin_cuda import HERE as STANDIN
    from tests.standin_cuda.standin_cuda import build as build_standin

    lib = build_standin().lib_dir
    subprocess.run(["gcc", "-O2", "-fno-omit-frame-pointer", f"-I{STANDIN}", "-o", str(exe),
                    str(HERE / "storm_nofp.c"), f"-L{lib}", "-lcaching_standin",
                    "-l:libcuda.so.1", f"-Wl,-rpath,{lib}"], check=True)  # fmt: skip
    return exe


def measure(exe: Path, lib: Path, argv: list[str], n: int, k: int, tmp: Path,
            copy: int = 0) -> dict[str, Any]:  # fmt: skip
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
    copies = [under_stack_copy(lib, alone, copy) for _ in range(k)] if copy else []
    return {
        "copy_ns": min(c[0][0] for c in copies) if copies else None,
        "copy_records": [c[1] for c in copies],
        "untraced_ns": base,
        "floor_ns": floor,
        "gputrace_ns": min(r["cpu"] for r in runs),
        "rows": [r["rows"] for r in runs],
        "expected_rows": 2 * n + 2,
        "drops": [r["drops"] for r in runs],
        "stack_rows": runs[0]["stacks"],
        "tables": runs[0]["unwind"].get("tables", []),
        "walk": runs[0]["unwind"].get("walk", ""),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=200_000, help="allocations (and frees)")
    ap.add_argument("--repeat", type=int, default=3, help="best of N for each mode")
    ap.add_argument("--copy-bytes", type=int, default=8192,
                    help="stack bytes the copy prototype copies (perf: 8192)")  # fmt: skip
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        fp_exe, lib = build(HERE.parent / "alloc_storm" / "storm.c", tmp / "alloc_storm")
        nofp_exe = build_nofp(tmp / "storm_nofp")
        res = {
            "frame_pointers": measure(fp_exe, lib, ["-", "0"], args.iters, args.repeat, tmp),
            "unwind_tables": measure(
                nofp_exe, lib, [], args.iters, args.repeat, tmp, args.copy_bytes
            ),
        }
        # the same stacks walked by tables for the top frames only, then frame
        # pointers (the walk before the whole-stack one; the recorder's knob)
        os.environ["GPUTRACE_UNWIND_WALK"] = "top"
        try:
            res["unwind_top_only"] = measure(nofp_exe, lib, [], args.iters, args.repeat, tmp)
        finally:
            del os.environ["GPUTRACE_UNWIND_WALK"]
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
    r = res["unwind_tables"]
    if not r["walk"].startswith("whole stack"):
        print(f"unwind_tables: walk {r['walk']!r}, not the whole-stack walk")
    c, u, f = r["copy_ns"], r["untraced_ns"], r["floor_ns"]
    print(f"stack copy ({args.copy_bytes} B, probe side only): {c:7.1f} (+{c - u:.0f})  "
          f"added/floor-added {(c - u) / max(f - u, 1e-9):.2f}  records {r['copy_records']} "
          f"of {args.iters + 1}")  # fmt: skip
    top = added["unwind_top_only"] - added["frame_pointers"]
    print(f"top-frames unwinder (before): +{top:.0f} ns per allocation over the "
          f"frame-pointer walk")  # fmt: skip
    extra = added["unwind_tables"] - added["frame_pointers"]
    print(
        f"whole-stack unwinder: +{extra:.0f} ns per allocation over the frame-pointer walk "
        f"({added['unwind_tables'] / max(added['frame_pointers'], 1e-9):.2f}x its added cost)"
    )


if __name__ == "__main__":
    main()
