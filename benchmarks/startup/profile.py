"""Where `gputrace record -o T -- true` spends its start-up: one recording in this
process, with libbcc's entry points wrapped to time each compile (clang, with the
maps bcc creates), each verifier load, each attach and detach, and the recorder's
steps (imports, layer builds, start, finish). Prints one table; run as root:

    PYTHONPATH=$PWD python3 benchmarks/startup/profile.py [record options]

(`--no-cache` for bcc's compile in this process, as before the cache;
GPUTRACE_BPF_CACHE=DIR for a cache of one's own, empty: cold.)
"""

from __future__ import annotations

import collections
import os
import resource
import sys
import tempfile
import time

T0 = time.perf_counter()
sys.path.insert(0, os.getcwd())
from gputrace.record import loader  # noqa: E402

bcc = loader.import_bcc()
T_BCC = time.perf_counter()
from gputrace import cli  # noqa: E402
from gputrace.record import layers, recorder  # noqa: E402

T_IMPORTS = time.perf_counter()

spent: dict[str, list[float]] = collections.defaultdict(list)  # wall
cpu: dict[str, list[float]] = collections.defaultdict(list)  # CPU of the calling thread
labels: dict[str, str] = {}


def wrap(lib: object, name: str, label: str) -> None:
    fn = getattr(lib, name)

    def timed(*a: object) -> object:
        t, c = time.perf_counter(), time.thread_time()
        try:
            return fn(*a)
        finally:
            spent[label].append(time.perf_counter() - t)
            cpu[label].append(time.thread_time() - c)

    timed.argtypes = fn.argtypes  # type: ignore[attr-defined]
    timed.restype = fn.restype  # type: ignore[attr-defined]
    setattr(lib, name, timed)


lib = bcc.lib
for name, label in [
    ("bpf_module_create_c_from_string", "clang compile + map create (per program)"),
    ("bcc_func_load", "verifier load (per function)"),
    ("bpf_attach_uprobe", "attach uprobe/uretprobe"),
    ("bpf_attach_tracepoint", "attach tracepoint"),
    ("bpf_attach_kfunc", "attach tp_btf"),
    ("bpf_detach_uprobe", "detach uprobe"),
    ("bpf_detach_tracepoint", "detach tracepoint"),
    ("bpf_module_destroy", "module destroy"),
]:
    wrap(lib, name, label)


def step(obj: object, name: str, label: str) -> None:
    fn = getattr(obj, name)

    def timed(*a: object, **k: object) -> object:
        t, c = time.perf_counter(), time.thread_time()
        try:
            return fn(*a, **k)
        finally:
            spent[label].append(time.perf_counter() - t)
            cpu[label].append(time.thread_time() - c)

    setattr(obj, name, timed)


from gputrace.record import bpf_cache, bpf_object  # noqa: E402
from gputrace.record import loader as _loader  # noqa: E402

step(bpf_object._Loaded, "_load", "verifier load, cached object (per function)")
step(bpf_cache, "compile_entries", "compile missing cache entries (child processes)")
step(bpf_object, "detach_parallel", "detach tracepoints (parallel closes)")
_loader.detach_parallel = bpf_object.detach_parallel
for cls in layers.RECORDER_LAYERS:
    step(cls, "build", f"build {cls.name} layer (compile+load+attach inside)")
step(recorder.Recorder, "_validate", "validate")
step(recorder.Recorder, "_start", "start (configure, spawn, attach, seed)")
step(recorder.Recorder, "_finish", "finish")
for cls in layers.RECORDER_LAYERS:
    step(cls, "close", f"close {cls.name} layer (detach, free)")

out = tempfile.mkdtemp(prefix="gt-startup-")
args = ["record", "-o", f"{out}/T", *sys.argv[1:], "--", "true"]
t = time.perf_counter()
rc = cli.main(args)
T_END = time.perf_counter()
ru = resource.getrusage(resource.RUSAGE_SELF)
print(f"\n{'what':58} {'n':>4} {'wall s':>8} {'CPU s':>7}  (CPU: of the calling thread; "
      "a build's own, its children's not)")
print(f"{'import bcc':58} {1:>4} {T_BCC - T0:8.3f}")
print(f"{'import gputrace cli + recorder':58} {1:>4} {T_IMPORTS - T_BCC:8.3f}")
for k, v in spent.items():
    print(f"{k:58} {len(v):>4} {sum(v):8.3f} {sum(cpu[k]):7.3f}"
          + (f"  (max CPU {max(cpu[k]):.3f})" if len(v) > 1 else ""))
print(f"{'record(), whole':58} {1:>4} {T_END - t:8.3f}")
print(f"{'process, whole (wall)':58} {'':>4} {T_END - T0:8.3f}")
print(f"user {ru.ru_utime:.2f} s, sys {ru.ru_stime:.2f} s, "
      f"peak RSS {ru.ru_maxrss / 1024:.0f} MB, rc {rc}")
