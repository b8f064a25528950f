#!/usr/bin/env python3
"""What naming the Python frames of programs that exit costs them. Run as root from
the repository root:

    python3 benchmarks/python_stacks/exit_cost.py [--counts 10,100,1000]
        [--python /root/.pyenv/versions/3.12.1/bin/python]

For each count N, a generated program defines N functions (N code objects), each
allocating 4 KiB once through the stand-in libcuda (ctypes) from its own line (N new
Python stacks, each stopping the process until the recorder has read its code
objects), and exits right after the last one without freeing anything. It prints
the wall time from its first allocation to its last. Columns: N, untraced seconds,
seconds under `gputrace record -- sh -c '...'` (one recording runs every N), the
Python stops the manifest counts, the frames written and how many are unknown.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

PROGRAM = '''
import ctypes, sys, time
LIB = ctypes.CDLL(sys.argv[1])
n = int(sys.argv[2])
dev, ctx = ctypes.c_int(0), ctypes.c_void_p(0)
LIB.cuInit(0); LIB.cuDeviceGet(ctypes.byref(dev), 0); LIB.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev)
src = "".join(f"def f{i}(p):\\n    LIB.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(4096))\\n"
              for i in range(n))
ns = {"LIB": LIB, "ctypes": ctypes}
exec(compile(src, sys.argv[0] + ".generated", "exec"), ns)
funcs = [ns[f"f{i}"] for i in range(n)]
p = ctypes.c_ulonglong(0)
t0 = time.monotonic()
for f in funcs:
    f(p)
print(f"span {n} {time.monotonic() - t0:.4f}", flush=True)
'''


def main() -> int:
    from gputrace.trace.reader import open_trace
    from tests.standin_cuda.standin_cuda import build

    ap = argparse.ArgumentParser()
    ap.add_argument("--counts", default="10,100,1000")
    ap.add_argument("--python", default="/root/.pyenv/versions/3.12.1/bin/python")
    ap.add_argument("--keep", metavar="DIR", help="keep the trace in DIR")
    a = ap.parse_args()
    counts = [int(x) for x in a.counts.split(",")]
    lib = str(build().libcuda)
    with tempfile.TemporaryDirectory() as tmp:
        prog = Path(tmp) / "many_codes.py"
        prog.write_text(PROGRAM)
        untraced = {}
        for n in counts:
            out = subprocess.run([a.python, str(prog), lib, str(n)], capture_output=True,
                                 text=True, check=True).stdout.split()  # fmt: skip
            untraced[n] = float(out[2])
        script = "\n".join(f"{shlex.quote(a.python)} {shlex.quote(str(prog))} "
                           f"{shlex.quote(lib)} {n}" for n in counts)
        trace = Path(a.keep) if a.keep else Path(tmp) / "trace"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        r = subprocess.run([sys.executable, "-m", "gputrace.cli", "record", "-o", str(trace),
                            "--", "sh", "-c", script], capture_output=True, text=True,
                           env=env, cwd=ROOT, check=True)  # fmt: skip
        traced = {int(ln.split()[1]): float(ln.split()[2]) for ln in r.stdout.splitlines()
                  if ln.startswith("span ")}
        py = open_trace(trace).manifest["api"]["python"]
        print(f"python stops {py.get('pauses')}, frames {py['frames']}, "
              f"unknown {py['unknown_frames']} {py.get('unknown_reasons')}")
        print("N  untraced_s  traced_s  traced_ms_per_new_stack")
        for n in counts:
            print(f"{n} {untraced[n]:.4f} {traced[n]:.3f} {1000 * traced[n] / n:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
