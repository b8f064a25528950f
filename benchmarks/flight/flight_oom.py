"""The flight recorder over a long host recording with one OOM (run.py --host --oom-at):
`gputrace record` in host mode (no command) with `--keep KEEP --freeze-on oom --after
AFTER` for --seconds while benchmarks/longrun/paced.c makes --rate RM_CONTROL ioctls a
second; the trace's bytes on disk (incidents/ excluded) every --every seconds; at
--oom-at a program asks the stand-in libcuda for 1 TiB (CUDA_ERROR_OUT_OF_MEMORY).

The full trace's report of that incident: the flight directory deletes its parts
older than KEEP, so by the end it no longer holds the failure. AFTER + 5 s after the
failure (the incident is frozen by then and the window still holds the minute
before it) every file of the flight directory is hard-linked into `snapshot/`: a
link keeps the bytes of a part the recorder deletes later, costs no copy and no CPU
while the storm runs, and the snapshot is analyzed after the recording ends. A plain
parallel recording would double the probes' cost on the shared machine and see the
same events.

At the end it checks and prints: peak disk within the bound (the bytes a second the
recording wrote, over KEEP plus one rotation, plus the files that are not parts),
exactly one incident trace, its window covering [failure - KEEP, failure + AFTER],
and `analyze --only oom -f json` of the incident equal to the snapshot's for that
incident, but for the fields listed in WINDOW_FIELDS."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE.parent))

from common import build_storm, oom_program, start_recorder  # noqa: E402

WINDOW_FIELDS = {
    "t_s": "seconds from the trace's first event to the failure: the incident trace "
    "starts KEEP (and up to a rotation) before the failure, the full one at the start",
}
"""Fields of an incident that legitimately differ between the incident trace and the
full trace, and why; every other field must be equal."""


def seconds(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    return float(text[:-1]) * units[text[-1]] if text[-1] in units else float(text)


def cpu_s(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def files(path: Path) -> Iterator[Path]:
    for root, dirs, names in os.walk(path):
        dirs[:] = [d for d in dirs if d != "incidents"]
        for n in names:
            yield Path(root) / n


def du(path: Path, parts_only: bool = False) -> int:
    total = 0
    for f in files(path):
        if parts_only and not f.name.startswith("part-"):
            continue
        with contextlib.suppress(FileNotFoundError):  # deleted by the recorder meanwhile
            total += f.lstat().st_size
    return total


def snapshot(out: Path, snap: Path) -> int:
    """Hard-link every file of `out` (incidents excluded) under `snap`; returns the count."""
    n = 0
    for f in files(out):
        dst = snap / f.relative_to(out)
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(f, dst)
            n += 1
        except FileNotFoundError:  # deleted by the recorder meanwhile: older than the window
            pass
    return n


def analyze_oom(trace: Path, dest: Path) -> dict[str, Any]:
    r = subprocess.run([sys.executable, "-m", "gputrace.cli", "analyze", str(trace), "--only",
                        "oom", "-f", "json"], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)  # fmt: skip
    dest.write_text(r.stdout)
    if r.returncode not in (0, 3):
        raise SystemExit(f"analyze {trace}: rc {r.returncode}: {r.stderr}")
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


def find_incidents(doc: Any) -> list[dict[str, Any]]:
    """The first list under a key `incidents` anywhere in the report."""
    if isinstance(doc, dict):
        if isinstance(doc.get("incidents"), list):
            return list(doc["incidents"])
        for v in doc.values():
            if found := find_incidents(v):
                return found
    elif isinstance(doc, list):
        for v in doc:
            if found := find_incidents(v):
                return found
    return []


def diff(a: Any, b: Any, path: str = "") -> Iterator[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            yield from diff(a.get(k, "<absent>"), b.get(k, "<absent>"), f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from diff(x, y, f"{path}[{i}]")
    elif a != b:
        yield f"{path}: incident {json.dumps(a)[:120]} vs full {json.dumps(b)[:120]}"


def compare(work: Path) -> bool:
    """The incident trace's oom report against the snapshot's, for the one incident."""
    from gputrace.trace.reader import open_trace

    out = work / "flight"
    m = json.loads((out / "manifest.json").read_text())
    inc_dir = out / m["incidents"][0]["dir"]
    inc = open_trace(inc_dir)
    calls = inc.scan("cuda_calls").collect()
    at = int(calls.filter(calls["result"] == 2)["ts_ns"][0])
    mine = analyze_oom(inc_dir, work / "incident-oom.json")
    full = analyze_oom(work / "snapshot", work / "full-oom.json")
    a, b = find_incidents(mine), find_incidents(full)
    print(f"incidents in the reports: incident trace {len(a)}, full trace {len(b)}")
    if len(a) != 1 or len(b) != 1:
        return False
    diffs = [d for d in diff(a[0], b[0]) if d.split(":")[0].split(".")[-1].split("[")[0]
             not in WINDOW_FIELDS]  # fmt: skip
    ignored = [d for d in diff(a[0], b[0]) if d not in diffs]
    for d in ignored:
        print("  differs (window field):", d)
    for d in diffs:
        print("  DIFFERS:", d)
    print(f"failure at ts {at}; oom report incident equal to the full trace's "
          f"(but {sorted(WINDOW_FIELDS) or 'nothing'}): {not diffs}")
    return not diffs


def host_oom(args: argparse.Namespace, paced_c: Path) -> int:
    work = args.workdir or Path(tempfile.mkdtemp(prefix="flight-oom-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.compare_only:
        return 0 if compare(work) else 1
    keep_s, after_s = seconds(args.keep), seconds(args.after)
    dev = work / "dev"
    dev.mkdir(exist_ok=True)
    if not (dev / "nvidiactl").exists():
        os.mknod(dev / "nvidiactl", 0o666 | 0o020000, os.makedev(1, 3))
    paced = build_storm(paced_c, work)
    oom, libcuda = oom_program(work)
    out, snap = work / "flight", work / "snapshot"
    rec = start_recorder(out, "--device-dir", str(dev), "--no-driver-layer", "--libcuda",
                         str(libcuda), "--keep", args.keep, "--freeze-on", "oom", "--after",
                         args.after, "-d", str(args.seconds))  # fmt: skip
    pid, t0 = rec.proc.pid, time.monotonic()
    storm = subprocess.Popen([str(paced), str(dev), str(args.rate), str(args.seconds - 2)],
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    print(f"host mode, --keep {args.keep} --freeze-on oom --after {args.after}, "
          f"{args.rate:,} ioctls/s, {args.seconds} s, OOM at {args.oom_at} s; work dir {work}")
    print(f"{'t s':>6} {'cpu s/s':>8} {'disk MiB':>9}", flush=True)
    last_cpu, peak, sizes, oom_wall, snapped = cpu_s(pid), 0, [], None, False
    while rec.proc.poll() is None:
        time.sleep(args.every)
        t = time.monotonic() - t0
        if args.oom_at is not None and oom_wall is None and t >= args.oom_at:
            r = subprocess.run([str(oom)], capture_output=True, text=True, timeout=60)
            oom_wall = time.monotonic() - t0
            print(f"{oom_wall:6.0f} OOM program: rc {r.returncode} {r.stdout.strip()}",
                  flush=True)  # fmt: skip
        if oom_wall is not None and not snapped and t >= oom_wall + after_s + 5:
            n = snapshot(out, snap)
            snapped = True
            print(f"{t:6.0f} snapshot: {n} files hard-linked", flush=True)
        try:
            cpu = cpu_s(pid)
        except (FileNotFoundError, ProcessLookupError):
            break
        size = du(out)
        peak = max(peak, size)
        sizes.append((t, size))
        print(f"{t:6.0f} {(cpu - last_cpu) / args.every:8.3f} {size / 2**20:9.1f}", flush=True)
        last_cpu = cpu
    rc = rec.wait(600)
    storm_out, _ = storm.communicate(timeout=60)
    print(f"recorder rc {rc}; storm {storm_out.strip()} (rc {storm.returncode})")
    if rc != 0:
        print("".join(rec.stderr), file=sys.stderr)
        return 1
    m = json.loads((out / "manifest.json").read_text())
    win = m["window"]
    print("window", json.dumps(win, sort_keys=True))
    print("drops", json.dumps(m.get("drops"), sort_keys=True))
    # the bytes a second while the storm ran (paced: its average rate holds over its
    # scheduled seconds); before and after it the recorder writes next to nothing
    dur_s = args.seconds - 2
    written = win["held_bytes"] + win["deleted_bytes"]
    other = du(out) - du(out, parts_only=True)
    bound = written / dur_s * (keep_s + win["rotate_s"]) + other
    disk_ok = peak <= bound
    print(f"disk: peak {peak / 2**20:.2f} MiB, final {du(out) / 2**20:.2f} MiB, bound "
          f"{bound / 2**20:.2f} MiB ({written / dur_s / 2**10:.0f} KiB/s written over "
          f"{dur_s:.0f} s of storm x ({keep_s:.0f} s + {win['rotate_s']} s rotation) + "
          f"{other / 2**10:.0f} KiB not parts); within: {disk_ok}; the recorder's own "
          f"peak_held_bytes {win['peak_held_bytes'] / 2**20:.2f} MiB")
    incs = m.get("incidents", [])
    print("incidents", json.dumps(incs, sort_keys=True))
    one_ok = len(incs) == 1 and incs[0]["trigger"] == "oom" and incs[0]["status"] == "kept"
    if not one_ok:
        print("exactly one kept oom incident: False")
        return 1
    from gputrace.trace.reader import open_trace

    inc = open_trace(out / incs[0]["dir"])
    iw = inc.manifest["window"]
    calls = inc.scan("cuda_calls").collect()
    at = int(calls.filter(calls["result"] == 2)["ts_ns"][0])
    its = inc.scan("ioctls").collect()["ts_ns"]
    win_ok = iw["from_ts_ns"] <= at - keep_s * 1e9 and iw["to_ts_ns"] >= at + after_s * 1e9
    print(f"incident window: from {(iw['from_ts_ns'] - at) / 1e9:+.3f} s to "
          f"{(iw['to_ts_ns'] - at) / 1e9:+.3f} s of the failure; its ioctls "
          f"{(its.min() - at) / 1e9:+.3f} s to {(its.max() - at) / 1e9:+.3f} s "
          f"({its.len():,} rows); covers [-{keep_s:.0f} s, +{after_s:.0f} s]: {win_ok}")
    same = compare(work) if snapped else False
    print(f"ALL: disk {disk_ok}, one incident {one_ok}, window {win_ok}, report {same}")
    return 0 if disk_ok and one_ok and win_ok and same else 1
