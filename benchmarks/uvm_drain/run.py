#!/usr/bin/env python3
"""UVM tools drain benchmark (issue 9). Run as root from the repository root:

    python3 benchmarks/uvm_drain/run.py [--reps 3] [--json out.json]

Questions it answers, side by side in one run:

1. Ceiling: how many events per second can the consumer drain AND decode on one
   core? A queue in this process's memory (the layout the driver writes) is
   filled with the real H200 capture (shared/real-h200, 82,042 V2 records, cycled),
   then drained and decoded in feeds of 1k/4k/16k/64k records. Two orders: "H200"
   (the driver delivered every replay at the end of the run, so fault batches stay
   open until then) and "closed" (each replay moved right after its batch, a
   synthetic reorder). Filling is the driver's work and is not timed.
2. Stand-in storm: `uvm_workload` on the FUSE stand-in with a `DriverLayer`
   attached from outside (65,536-entry queue, 10 ms drains, `poll()` every 100 ms
   as the recorder's loop would): events/s, drops, rows, recorder CPU (cores:
   this process's user+sys over the run), exit -> release of the target's uvm file.
3. Workload cost: the same storm's wall time with and without tracking.
4. Sampling thread: CPU of an RM `MemorySampler` at 100 ms (and 10 ms) against the
   stand-in, as cores and microseconds per sample.

The stand-in server does the driver's work in another process (FUSE round trip
and one process_vm_writev per record), so the storm rate measures the stand-in,
not the recorder: the ceiling is the recorder's number.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import lzma
import os
import resource
import select
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from gputrace.record import rm_client, uvm_tools  # noqa: E402
from gputrace.record.decode_uvm import UvmStreamContext, UvmStreamDecoder  # noqa: E402
from gputrace.record.driver import parse_version  # noqa: E402
from gputrace.record.driver_layer import DriverLayer  # noqa: E402
from tests.standin import standin  # noqa: E402

CAPTURE = ROOT.parent / "shared" / "real-h200" / "uvm-tools-events.v2.raw.xz"
ES = 72
STORM = ["--pages", "65536", "--cpu-pages", "4096", "--evict-pages", "65536",
         "--capacity", "4096", "--pingpong", "1024", "--batch", "256"]  # fmt: skip


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def mono() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


# ------------------------------------------------------------------------ 1. ceiling
def load_capture(path: Path) -> bytes:
    if not path.exists():
        sys.exit(f"uvm_drain: error: {path} not found (the real H200 capture)")
    return lzma.decompress(path.read_bytes())


def closed_order(raw: bytes) -> bytes:
    """SYNTHETIC reorder: each replay right after the last fault of its batch."""
    a = np.frombuffer(raw, np.uint8).reshape(-1, ES)
    t = a[:, 0]
    pos = np.arange(len(a), dtype=np.float64)
    fb = a[t == 3][:, 32:36].copy().view("<u4").ravel()
    last = {int(b): float(p) for b, p in zip(fb, np.flatnonzero(t == 3), strict=True)}
    rb = a[t == 4][:, 4:8].copy().view("<u4").ravel()
    pos[t == 4] = [last.get(int(b), 1e12) + 0.5 for b in rb]
    return bytes(a[np.argsort(pos, kind="stable")].tobytes())


def ceiling(raw: bytes, feed: int, total: int) -> dict[str, float]:
    """Drain + decode `total` records in feeds of `feed` through a real EventQueue."""
    q = uvm_tools.EventQueue(1 << 16, ES)
    dec = UvmStreamDecoder(UvmStreamContext(1, 2, True, {0: -1, 1: 0}))
    n_src = len(raw) // ES
    src = (ctypes.c_char * len(raw)).from_buffer_copy(raw)
    put = src_i = done = 0
    wall = cpu = drain_wall = 0.0
    rows = 0
    while done < total:
        k = min(feed, total - done, (1 << 16) - 1)
        left = k
        while left:  # the "driver": bulk copies, split at the ring's and the source's end
            m = min(left, (1 << 16) - put, n_src - src_i)
            ctypes.memmove(q.buffer.addr + put * ES, ctypes.addressof(src) + src_i * ES, m * ES)
            put = (put + m) % (1 << 16)
            src_i = (src_i + m) % n_src
            left -= m
        q.control.put_behind = put
        c0, w0 = time.thread_time(), time.perf_counter()
        data = q.drain()
        w1 = time.perf_counter()
        for tab in dec.feed(data, 0).values():
            rows += tab.num_rows
        wall += time.perf_counter() - w0
        drain_wall += w1 - w0
        cpu += time.thread_time() - c0
        done += k
    for tab in dec.finish().values():
        rows += tab.num_rows
    q.close()
    return {"records": done, "feed": feed, "wall_s": wall, "cpu_s": cpu,
            "mev_s": done / wall / 1e6, "mev_per_core_s": done / cpu / 1e6 if cpu else 0.0,
            "drain_only_mev_s": done / drain_wall / 1e6, "rows": rows}  # fmt: skip


# ------------------------------------------------------------------ 2-3. stand-in storm
def storm(exe: Path, dev: Path, track: bool, entries: int) -> dict[str, Any]:
    """One storm run: workload wall time; with `track`, the layer's rows, drops, CPU."""
    layer = None
    if track:
        layer = DriverLayer(str(dev), standin.DRIVER_VERSION, queue_entries=entries,
                            sample_ms=100.0, drain_ms=10.0)  # fmt: skip
        layer.start()
    rows = 0
    try:
        with standin.started_waiting([str(exe), str(dev), "--wait", *STORM]) as w:
            pidfd = os.pidfd_open(w.pid)
            if layer is not None and not layer.attach(w.pid):
                sys.exit(f"uvm_drain: error: attach failed: {layer.manifest()['driver_layer']}")
            assert w.proc.stdin is not None
            c0, t0 = cpu_s(), mono()
            w.proc.stdin.write("go\n")
            w.proc.stdin.close()
            exited: list[int] = []

            # a thread stamps the exit: the loop below may be decoding when it happens
            def wait_exit() -> None:
                select.select([pidfd], [], [])
                exited.append(mono())

            watcher = threading.Thread(target=wait_exit)
            watcher.start()
            while watcher.is_alive():  # the recorder's loop: poll every 100 ms until exit
                watcher.join(0.1)
                if layer is not None:
                    rows += sum(t.num_rows for v in layer.poll().values() for t in v)
            t_exit = exited[0]
            os.close(pidfd)
            w.proc.wait()
            assert w.proc.returncode == 0, w.proc.stderr.read() if w.proc.stderr else ""
        pid = w.pid
        st = standin.wait_state(dev, lambda s: any(x["pid"] == pid for x in s.uvm_releases),
                                timeout=30)  # fmt: skip
        rel = [x["mono_ns"] for x in st.uvm_releases if x["pid"] == pid]
        if layer is not None:
            rows += sum(t.num_rows for v in layer.stop().values() for t in v)
        t_end, c_end = mono(), cpu_s()
    finally:
        if layer is not None:
            layer.stop()
    out: dict[str, Any] = {"workload_s": (t_exit - t0) / 1e9,
                           "release_ms": (rel[0] - t_exit) / 1e6 if rel else None}  # fmt: skip
    if layer is not None:
        m = layer.manifest()
        out.update(rows=rows, drops=sum(m["drops"].values()),
                   cpu_cores=(c_end - c0) / ((t_end - t0) / 1e9), cpu_s=c_end - c0)  # fmt: skip
    return out


# ----------------------------------------------------------------------- 4. sampler
def sampler_cost(dev: Path, interval_ms: float, seconds: float) -> dict[str, float]:
    client = rm_client.RmClient.open(str(dev), parse_version(standin.DRIVER_VERSION))
    try:
        t0 = time.perf_counter()
        c0 = time.thread_time()
        n = 200
        for _ in range(n):  # cost of one sample, in this thread
            for g in client.gpus:
                client.sample(g)
        per_sample_us = (time.thread_time() - c0) / n * 1e6
        per_sample_wall_us = (time.perf_counter() - t0) / n * 1e6
        s = rm_client.MemorySampler(client, interval_ms)
        c0, w0 = cpu_s(), time.perf_counter()
        s.start()
        time.sleep(seconds)  # the process is otherwise idle: its CPU is the sampler's
        s.stop()
        cores = (cpu_s() - c0) / (time.perf_counter() - w0)
        samples = s.samples
    finally:
        client.close()
    return {"interval_ms": interval_ms, "cores": cores, "samples": samples,
            "per_sample_cpu_us": per_sample_us,
            "per_sample_wall_us": per_sample_wall_us}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--records", type=int, default=400_000, help="per ceiling measurement")
    ap.add_argument("--queue", type=int, default=1 << 16, help="tracker queue entries")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    if standin.skip_reason():
        sys.exit(f"uvm_drain: error: {standin.skip_reason()}")
    res: dict[str, Any] = {"ceiling": [], "storm": {}, "sampler": []}
    raw = load_capture(CAPTURE)
    orders = {"H200": raw, "closed": closed_order(raw)}
    print("1. drain + decode ceiling (one thread; H200 capture cycled)")
    print(f"{'order':8} {'feed':>6} {'M ev/s':>7} {'M ev/s/core':>11} {'drain only':>10}")
    for name, data in orders.items():
        for feed in (1024, 4096, 16384, 65535):
            best = max((ceiling(data, feed, a.records) for _ in range(a.reps)),
                       key=lambda r: r["mev_per_core_s"])  # fmt: skip
            res["ceiling"].append({"order": name, **best})
            print(f"{name:8} {feed:6d} {best['mev_s']:7.2f} {best['mev_per_core_s']:11.2f} "
                  f"{best['drain_only_mev_s']:10.1f}")  # fmt: skip
    standin.build("uvm_workload")
    exe = standin.BUILD_DIR / "uvm_workload"
    exp = standin.print_expected(exe, *STORM)
    events = sum(exp["by_type"].values())
    with tempfile.TemporaryDirectory() as td, standin.mounted_driver(Path(td)) as dev:
        runs: dict[str, list[dict[str, Any]]] = {"untracked": [], "tracked": []}
        for _ in range(a.reps):
            for mode in ("untracked", "tracked"):
                runs[mode].append(storm(exe, dev, mode == "tracked", a.queue))
        res["storm"] = {"events": events, **runs}
        u = statistics.median(r["workload_s"] for r in runs["untracked"])
        t = statistics.median(r["workload_s"] for r in runs["tracked"])
        tr = runs["tracked"]
        print(
            f"\n2-3. stand-in storm: {events} events per run, {a.reps} runs each, "
            f"queue {a.queue} entries, drains every 10 ms, poll() every 100 ms"
        )
        print(f"untracked workload {u * 1e3:.0f} ms; tracked {t * 1e3:.0f} ms: {t / u:.2f}x")
        print(
            f"tracked: {events / t / 1e6:.3f} M ev/s, drops {[r['drops'] for r in tr]}, "
            f"rows {[r['rows'] for r in tr]}, recorder "
            f"{statistics.median(r['cpu_cores'] for r in tr):.2f} cores "
            f"({statistics.median(r['cpu_s'] for r in tr) / events * 1e9:.0f} ns CPU/event)"
        )
        print("exit->release ms: untracked "
              f"{[round(r['release_ms'], 1) for r in runs['untracked']]}, tracked "
              f"{[round(r['release_ms'], 1) for r in tr]}")  # fmt: skip
        print("\n4. RM sampling thread (1 GPU)")
        for ms in (100.0, 10.0):
            s = sampler_cost(dev, ms, 3.0)
            res["sampler"].append(s)
            print(f"every {ms:5.0f} ms: {s['cores'] * 100:.3f}% of a core, "
                  f"{s['per_sample_cpu_us']:.0f} us CPU per sample "
                  f"({s['per_sample_wall_us']:.0f} us wall)")  # fmt: skip
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
