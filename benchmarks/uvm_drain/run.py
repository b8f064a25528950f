#!/usr/bin/env python3
"""UVM tools drain benchmark. Run as root from the repository root:

    python3 benchmarks/uvm_drain/run.py [--reps 3] [--json out.json]
    python3 benchmarks/uvm_drain/run.py --decode-only [--baseline REV]  # no root needed

Questions it answers, side by side in one run:

1. Ceiling: how many events per second can the consumer drain AND decode on one
   core? A queue in this process's memory (the layout the driver writes) is
   filled with the real H200 capture (shared/real-h200, 82,042 V2 records, cycled),
   then drained and decoded in feeds of 1k/4k/16k/64k records. Two orders: "H200"
   (the driver delivered every replay at the end of the run, so fault batches stay
   open until then) and "closed" (each replay moved right after its batch, a
   synthetic reorder). Filling is the driver's work and is not timed.
2. Stand-in storm: `uvm_workload` on the FUSE stand-in with a `DriverPoller`
   attached from outside (65,536-entry queue, 10 ms drains, `poll()` every 100 ms
   as the recorder's loop would): events/s, drops, rows, recorder CPU (cores:
   this process's user+sys over the run), exit -> release of the target's uvm file.
3. Workload cost: the same storm's wall time with and without tracking.
4. Sampling thread: CPU of an RM `MemorySampler` at 100 ms (and 10 ms) against the
   stand-in, as cores and microseconds per sample.

`--decode-only` runs only the decoder (no queue, no stand-in, no root): the H200
capture and a SYNTHETIC 1 M-record V2 stream whose batches stay open for 2,000
batches, fed in 1k/4k/16k/64k-record feeds, CPU time per record; with `--baseline
REV` the decoder of git revision REV runs side by side in the same process on the
same bytes, and the two outputs are compared table by table.

The stand-in server does the driver's work in another process (FUSE round trip
and one process_vm_writev per record), so the storm rate measures the stand-in,
not the recorder: the ceiling is the recorder's number.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import lzma
import os
import resource
import select
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from gputrace.record.driver_layer.poller import DriverPoller  # noqa: E402
from gputrace.record.driver_version import parse_version  # noqa: E402
from gputrace.record.rm_query import client as rm_client  # noqa: E402
from gputrace.record.rm_query import sampler as memory_sampler  # noqa: E402
from gputrace.record.uvm_tools import decode as decode_uvm  # noqa: E402
from gputrace.record.uvm_tools import tracker as uvm_tools  # noqa: E402
from gputrace.record.uvm_tools.decode import UvmStreamContext, UvmStreamDecoder  # noqa: E402
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


# ---------------------------------------------------------------- decoder only
FEEDS = (1024, 4096, 16384, 65536)
# V2 records (uvm_types.h, 595.45.04), packed here independently of the decoder's tables
_V2_FAULT = np.dtype({"names": ["type", "fault_type", "gpu", "address", "ts", "ts_gpu",
                                "batch", "client_type", "access"],
                      "formats": ["u1", "u1", "<u2", "<u8", "<u8", "<u8", "<u4", "u1", "u1"],
                      "offsets": [0, 1, 2, 8, 16, 24, 32, 36, 37], "itemsize": ES})
_V2_REPLAY = np.dtype({"names": ["type", "client_type", "gpu", "batch", "ts", "ts_gpu"],
                       "formats": ["u1", "u1", "<u2", "<u4", "<u8", "<u8"],
                       "offsets": [0, 1, 2, 4, 8, 16], "itemsize": ES})
_V2_CPU = np.dtype({"names": ["type", "access", "address", "ts", "pid", "tid"],
                    "formats": ["u1", "u1", "<u8", "<u8", "<u4", "<u4"],
                    "offsets": [0, 1, 8, 16, 24, 28], "itemsize": ES})
_V2_MIGRATION = np.dtype({"names": ["type", "cause", "src", "dst", "address", "bytes",
                                    "begin", "end"],
                          "formats": ["u1", "u1", "<u2", "<u2", "<u8", "<u8", "<u8", "<u8"],
                          "offsets": [0, 1, 4, 6, 16, 24, 32, 40], "itemsize": ES})


def synthetic_stream(records: int, delay: int = 2000, seed: int = 1) -> bytes:
    """SYNTHETIC V2 stream of about `records` records: GPU fault batches of 56-256
    faults (about 5% duplicate addresses), a CPU fault and a migration every 40
    batches, and each batch's replay `delay` batches after its faults (so ~delay
    batches are open at any time; the rest replay at the end)."""
    rng = np.random.default_rng(seed)
    parts: list[bytes] = []
    ts, n, b = 10**9, 0, 0
    replays: list[tuple[int, int]] = []

    def replay(batch: int) -> bytes:
        r = np.zeros(1, _V2_REPLAY)
        r["type"], r["client_type"], r["gpu"], r["batch"] = 4, 1, 1, batch
        r["ts"], r["ts_gpu"] = ts, ts * 3
        return r.tobytes()

    while n < records:
        m = int(rng.integers(56, 257))
        f = np.zeros(m, _V2_FAULT)
        pages = rng.integers(0, 1 << 18, m)
        dup = rng.random(m) < 0.05
        pages[1:][dup[1:]] = pages[:-1][dup[1:]]
        f["type"], f["gpu"], f["batch"], f["client_type"] = 3, 1, b, 1
        f["fault_type"] = rng.integers(0, 2, m)
        f["access"] = np.where(rng.random(m) < 0.7, 2, 1)
        f["address"] = (0x7F00_0000_0000 + pages * 4096).astype(np.uint64)
        f["ts"] = ts + np.arange(m) * 40
        f["ts_gpu"] = f["ts"] * 3
        ts += m * 40 + 1000
        parts.append(f.tobytes())
        replays.append((b, ts))
        n += m
        if b >= delay:
            parts.append(replay(b - delay))
            n += 1
        if b % 40 == 0:
            c = np.zeros(1, _V2_CPU)
            c["type"], c["access"], c["address"], c["ts"], c["pid"], c["tid"] = (
                1, 2, 0x7F00_0000_0000 + b * 4096, ts, 7, 7)
            g = np.zeros(1, _V2_MIGRATION)
            g["type"], g["cause"], g["src"], g["dst"] = 2, 1, 0, 1
            g["address"], g["bytes"], g["begin"], g["end"] = (
                0x7F00_0000_0000 + b * (2 << 20), 2 << 20, ts, ts + 5000)
            parts += [c.tobytes(), g.tobytes()]
            n += 2
        b += 1
    parts += [replay(x) for x in range(max(0, b - delay), b)]
    return b"".join(parts)


def load_decoder(rev: str) -> Any:
    """gputrace/record/uvm_tools/decode.py as of git revision `rev`, as a module."""
    # the decoder's path before and after the move to its concept folder
    for path in ("gputrace/record/uvm_tools/decode.py", "gputrace/record/decode_uvm.py"):
        src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{path}"],
                             capture_output=True, text=True, check=False)  # fmt: skip
        if not src.returncode:
            break
    if src.returncode:
        sys.exit(f"uvm_drain: error: git show {rev}: {src.stderr.strip()}")
    spec = importlib.util.spec_from_loader(f"decode_uvm_{rev}", loader=None)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    exec(compile(src.stdout, f"{rev}:decode_uvm.py", "exec"), mod.__dict__)
    return mod


def decode_run(mod: Any, raw: bytes, feed: int) -> tuple[float, float, list[Any]]:
    """CPU and wall seconds to decode `raw` in feeds of `feed` records, and the tables."""
    dec = mod.UvmStreamDecoder(mod.UvmStreamContext(1, 2, True, {0: -1, 1: 0}))
    view = memoryview(raw)
    out: list[Any] = []
    c0, w0 = time.thread_time(), time.perf_counter()
    for i in range(0, len(raw), feed * ES):
        out.append(dec.feed(view[i:i + feed * ES], 0))
    out.append(dec.finish())
    return time.thread_time() - c0, time.perf_counter() - w0, out


def same_tables(a: list[Any], b: list[Any]) -> bool:
    """Whether two runs' outputs hold the same rows, table by table."""
    def whole(out: list[Any]) -> dict[str, Any]:
        names = {k for o in out for k in o}
        return {k: pa.concat_tables([o[k] for o in out if k in o]) for k in names}
    wa, wb = whole(a), whole(b)
    return wa.keys() == wb.keys() and all(wa[k].equals(wb[k]) for k in wa)


def decode_only(baseline: str | None, reps: int, records: int) -> list[dict[str, Any]]:
    decoders: dict[str, Any] = {"current": decode_uvm}
    if baseline:
        decoders = {baseline: load_decoder(baseline), **decoders}
    streams = {"H200": load_capture(CAPTURE), "synthetic": synthetic_stream(records)}
    res = []
    print("decoder only: CPU time per record (best of "
          f"{reps}; {' vs '.join(decoders)}, same process, same bytes)")
    print(f"{'stream':10} {'records':>8} {'feed':>6} "
          + " ".join(f"{n[:10]:>10} ns/rec {'M rec/s':>8}" for n in decoders) + "  same rows")
    for sname, raw in streams.items():
        n = len(raw) // ES
        for feed in FEEDS:
            best: dict[str, float] = {}
            outs: dict[str, list[Any]] = {}
            for _ in range(reps):  # alternate decoders so load changes hit both alike
                for name, mod in decoders.items():
                    cpu, _wall, out = decode_run(mod, raw, feed)
                    best[name] = min(best.get(name, cpu), cpu)
                    outs[name] = out
            same = all(same_tables(outs["current"], o) for o in outs.values())
            row = {"stream": sname, "records": n, "feed": feed, "same_rows": same,
                   **{f"{k}_ns_per_record": v / n * 1e9 for k, v in best.items()}}
            res.append(row)
            print(f"{sname:10} {n:8d} {feed:6d} " + " ".join(
                f"{best[k] / n * 1e9:17.0f} {n / best[k] / 1e6:8.2f}" for k in decoders)
                + f"  {'yes' if same else 'NO'}")  # fmt: skip
    return res


# ------------------------------------------------------------------ 2-3. stand-in storm
def storm(exe: Path, dev: Path, track: bool, entries: int) -> dict[str, Any]:
    """One storm run: workload wall time; with `track`, the layer's rows, drops, CPU."""
    layer = None
    if track:
        layer = DriverPoller(str(dev), standin.DRIVER_VERSION, queue_entries=entries,
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
        s = memory_sampler.MemorySampler(client, interval_ms)
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
    ap.add_argument("--decode-only", action="store_true",
                    help="only the decoder, on the H200 capture and a synthetic stream")
    ap.add_argument("--baseline", metavar="REV",
                    help="with --decode-only: also run the decoder of git revision REV")
    ap.add_argument("--synthetic-records", type=int, default=1_000_000)
    a = ap.parse_args()
    if a.decode_only:
        rows = decode_only(a.baseline, a.reps, a.synthetic_records)
        if a.json:
            a.json.write_text(json.dumps({"decode_only": rows}, indent=1))
        return
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
