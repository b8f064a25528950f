#!/usr/bin/env python3
"""ioctl storm benchmark for `gputrace record`. Run as root from the
repository root:  python3 benchmarks/ioctl_storm/run.py [--calls 2000000]

One run measures the storm untraced, under `gputrace record -p` with each syscall
hook mechanism (tp_btf and the syscalls:* tracepoints, GPUTRACE_SYSCALL_HOOKS),
with 2 storm processes, under `strace -f -e trace=ioctl` (fewer calls: strace is
slow) and under a bpftrace counter, then prints slowdowns, the recorder's CPU,
drops and Parquet bytes/event. `cpu ns` is the storm thread's own CPU time per
call (where the probes run), the figure to compare on a shared machine; the
untraced storm runs before and after the traced ones and the least is kept.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from common import build_storm  # noqa: E402

sys.path.insert(0, str(HERE.parent / "untraced"))
from revision import bpf_stats, other_tracers, start_recorder_from, tree_of, under_floor  # noqa: E402


def parse_both(out: str) -> tuple[float, float]:
    """(wall ns, thread CPU ns) per call."""
    for line in out.splitlines():
        if line.startswith("calls "):
            f = line.split()
            return float(f[5]), float(f[7])
    raise RuntimeError(f"no result in {out!r}")


def parse(out: str) -> float:
    return parse_both(out)[0]


def untraced_both(storm: Path, dev: Path, n: int) -> tuple[float, float]:
    return parse_both(subprocess.run([str(storm), str(dev), str(n)], capture_output=True,
                                     text=True, check=True).stdout)  # fmt: skip


def untraced(storm: Path, dev: Path, n: int) -> float:
    return untraced_both(storm, dev, n)[0]


def cpu_of(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def traced(storm: Path, dev: Path, n: int, tmp: Path, procs: int = 1,
           hooks: str = "tracepoint", tree: Path | None = None,
           raw: bool = False) -> dict[str, Any]:  # fmt: skip
    """One storm under `gputrace record -p`; with `raw`, `record --raw` and then
    `gputrace convert` (its CPU reported apart: it runs after, or elsewhere)."""
    out = tmp / f"trace{procs}-{hooks}-{abs(hash(tree))}-{int(raw)}"
    os.environ["GPUTRACE_SYSCALL_HOOKS"] = hooks
    ws = [
        subprocess.Popen(
            [str(storm), str(dev), str(n // procs), "--wait"],
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        for _ in range(procs)
    ]
    pids = [int(w.stdout.readline().split()[1]) for w in ws]  # type: ignore[union-attr]
    recp = start_recorder_from(tree, out, "--device-dir", str(dev), *(["--raw"] if raw else []),
                               *[a for p in pids for a in ("-p", str(p))])  # fmt: skip
    rec = recp.proc
    c0 = cpu_of(rec.pid)
    seen = other_tracers()
    t0 = time.monotonic()
    for w in ws:
        w.stdin.write("go\n")  # type: ignore[union-attr]
        w.stdin.flush()  # type: ignore[union-attr]
    both = [parse_both(w.communicate()[0]) for w in ws]
    per_call = [b[0] for b in both]
    storm_wall = time.monotonic() - t0
    _, status, ru = os.wait4(rec.pid, 0)
    rec.returncode = os.waitstatus_to_exitcode(status)
    total_wall = time.monotonic() - t0
    seen = max(seen, other_tracers())
    cpu = ru.ru_utime + ru.ru_stime - c0
    recp._t.join(timeout=10)  # its stderr, whole
    # parts written raw while the recorder was behind are decoded when it ends: that
    # CPU is the recorder's, but spent after the targets, as `convert` after --raw
    spill_cpu = sum(float(line.split(" in ")[1].split()[0]) for line in recp.stderr
                    if line.startswith("gputrace: decoded "))  # fmt: skip
    from gputrace.trace.reader import open_trace

    raw_size = sum(p.stat().st_size for p in (out / "ioctls").glob("part-*.gtraw"))
    convert_cpu = None
    if raw:
        with tempfile.TemporaryFile() as err:
            c = subprocess.Popen([sys.executable, "-m", "gputrace.cli", "convert", str(out)],
                                 cwd=tree or HERE.parent.parent, stdout=subprocess.DEVNULL,
                                 stderr=err)  # fmt: skip
            _, cstatus, cru = os.wait4(c.pid, 0)
            c.returncode = os.waitstatus_to_exitcode(cstatus)
            if c.returncode != 0:
                err.seek(0)
                raise RuntimeError(f"gputrace convert failed: {err.read().decode().strip()}")
        convert_cpu = cru.ru_utime + cru.ru_stime
    t = open_trace(out)
    rows = t.rows("ioctls")
    size = sum(p.stat().st_size for p in t.parts("ioctls"))
    return {
        "raw": raw,
        "raw_bytes_per_event": raw_size / max(rows, 1),
        "convert_cpu_s": convert_cpu,
        "hooks": t.manifest.get("syscall_hooks", {}).get("mechanism", "tracepoint"),
        "ns_per_call": sum(per_call) / len(per_call),
        "cpu_ns_per_call": sum(b[1] for b in both) / len(both),
        "events": rows,
        "expected_events": n // procs * procs,
        "drops": sum(t.drops.values()),
        "events_per_s": rows / storm_wall,
        "recorder_cpu_s": cpu,
        "recorder_cores": (cpu - spill_cpu) / total_wall,
        "recorder_cpu_ns_per_event": (cpu - spill_cpu) / max(rows, 1) * 1e9,
        "spill_decode_ns_per_event": spill_cpu / max(rows, 1) * 1e9,
        "spilled_items": t.manifest.get("spilled", {}).get("ioctls", 0),
        "parquet_bytes": size,
        "bytes_per_event": size / max(rows, 1),
        "other_tracers": seen,
    }


def strace(storm: Path, dev: Path, n: int) -> float | None:
    if shutil.which("strace") is None:
        return None
    r = subprocess.run(["strace", "-f", "-qq", "-e", "trace=ioctl", "-o", "/dev/null",
                        str(storm), str(dev), str(n)], capture_output=True, text=True)  # fmt: skip
    return parse(r.stdout)


def bpftrace(storm: Path, dev: Path, n: int) -> float | None:
    if shutil.which("bpftrace") is None:
        return None
    prog = 'tracepoint:syscalls:sys_enter_ioctl /comm == "storm"/ { @calls = count(); }'

    def unlimited() -> None:
        hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (hard, hard))

    bt = subprocess.Popen(["bpftrace", "-e", prog], stdout=subprocess.PIPE, text=True,
                          preexec_fn=unlimited)  # fmt: skip
    assert bt.stdout is not None
    while "Attaching" not in (line := bt.stdout.readline()):
        if not line and bt.poll() is not None:
            return None
    try:
        return untraced(storm, dev, n)
    finally:
        bt.terminate()
        bt.wait()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2_000_000)
    ap.add_argument("--strace-calls", type=int, default=200_000)
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--before", default="", help="also run the recorder of this revision (or tree directory)"
    )
    ap.add_argument(
        "--after",
        default="",
        help="the recorder to measure: a revision or tree (default: this tree)",
    )
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        dev = tmp / "dev"
        dev.mkdir()
        os.mknod(dev / "nvidiactl", 0o666 | 0o020000, os.makedev(1, 3))
        storm = build_storm(HERE / "storm.c", tmp)
        after = tree_of(a.after, tmp / "after")
        before = tree_of(a.before, tmp / "before") if a.before else None
        b0 = untraced_both(storm, dev, a.calls)
        fl = {m: under_floor(m, lambda: untraced_both(storm, dev, a.calls))
              for m in ("tracepoint", "tp_btf")}  # fmt: skip
        old = {m: traced(storm, dev, a.calls, tmp, 1, m, before)
               for m in (("tracepoint", "tp_btf") if before else ())}  # fmt: skip
        old2 = traced(storm, dev, a.calls, tmp, 2, "tracepoint", before) if before else None
        rec1 = traced(storm, dev, a.calls, tmp, 1, "tp_btf", after)
        rec1tp = traced(storm, dev, a.calls, tmp, 1, "tracepoint", after)
        rec2 = traced(storm, dev, a.calls, tmp, 2, "tracepoint", after)
        raw1 = traced(storm, dev, a.calls, tmp, 1, "tracepoint", after, raw=True)
        raw2 = traced(storm, dev, a.calls, tmp, 2, "tracepoint", after, raw=True)
        b1 = untraced_both(storm, dev, a.calls)
        base, base_cpu = min(b0[0], b1[0]), min(b0[1], b1[1])
        st = strace(storm, dev, a.strace_calls)
        bt = bpftrace(storm, dev, a.calls)
    res = {
        "calls": a.calls,
        "untraced_ns_per_call": base,
        "untraced_cpu_ns_per_call": base_cpu,
        "gputrace": rec1,
        "gputrace_tracepoints": rec1tp,
        "gputrace_2_storms": rec2,
        "gputrace_raw": raw1,
        "gputrace_raw_2_storms": raw2,
        "floor_cpu_ns_per_call": {m: v[1] for m, v in fl.items()},
        "before": old,
        "before_2_storms": old2,
        "gputrace_slowdown": rec1["ns_per_call"] / base,
        "gputrace_added_ns_per_call": rec1["ns_per_call"] - base,
        "strace_ns_per_call": st,
        "strace_slowdown": st / base if st else None,
        "bpftrace_ns_per_call": bt,
        "bpftrace_slowdown": bt / base if bt else None,
    }
    if a.json:
        print(json.dumps(res, indent=2))
        return 0
    load = os.getloadavg()
    print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; "
          f"kernel.bpf_stats_enabled={bpf_stats()}")
    print(f"untraced              {base:8.1f} ns/ioctl  cpu {base_cpu:.1f} ns")
    for m, (wall, cpu_ns) in fl.items():
        print(f"{'floor (' + m + ')':<21} {wall:8.1f} ns/ioctl  cpu {cpu_ns:.1f} ns: "
              f"+{cpu_ns - base_cpu:.0f} ns (null programs on the same hooks)")  # fmt: skip
    rows = [("before", old[m]) for m in old]
    rows += [("before, 2 storms", old2)] if old2 is not None else []
    rows += [("gputrace record", rec1), ("  (tracepoints)", rec1tp), ("gputrace, 2 storms", rec2),
             ("record --raw", raw1), ("--raw, 2 storms", raw2)]
    for label, r in rows:
        print(f"{label:<21} {r['ns_per_call']:8.1f} ns/ioctl  x{r['ns_per_call'] / base:.2f}  "
              f"cpu {r['cpu_ns_per_call']:.1f} ns: +{r['cpu_ns_per_call'] - base_cpu:.0f} ns "
              f"x{r['cpu_ns_per_call'] / base_cpu:.2f} ({r['hooks']})  "
              f"{r['events_per_s'] / 1e6:.2f} M events/s  drops {r['drops']}  "
              f"events {r['events']}/{r['expected_events']}  "
              f"recorder {r['recorder_cores']:.2f} cores "
              f"({r['recorder_cpu_ns_per_event']:.0f} ns/event"
              + (f"; spilled {r['spilled_items']} items, decoded at the end "
                 f"{r['spill_decode_ns_per_event']:.0f} ns/event" if r["spilled_items"] else "")
              + ")  "
              f"{r['bytes_per_event']:.2f} B/event on disk"
              + (f" ({r['raw_bytes_per_event']:.2f} raw); convert "
                 f"{r['convert_cpu_s'] / max(r['events'], 1) * 1e9:.0f} ns/event, after"
                 if r["raw"] else "")
              + (f"  [others: {r['other_tracers']}]" if r["other_tracers"] else ""))  # fmt: skip
    for label, r in (("default", rec1tp), ("default, 2 storms", rec2), ("--raw", raw1),
                     ("--raw, 2 storms", raw2)):
        ns = r["recorder_cpu_ns_per_event"]
        print(f"recorder at 2 M events/s ({label}): {ns * 2e6 / 1e9:.2f} cores while "
              f"recording (from {ns:.0f} ns/event; target <= 0.5)")  # fmt: skip
    if st:
        print(
            f"strace -f             {st:8.1f} ns/ioctl  x{st / base:.1f}  ({a.strace_calls} calls)"
        )
    if bt:
        print(f"bpftrace count        {bt:8.1f} ns/ioctl  x{bt / base:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
