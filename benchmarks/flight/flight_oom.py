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

from common import build_storm, cpu_s, oom_program, start_recorder  # noqa: E402

WINDOW_FIELDS = {
    "t_s": "seconds from the trace's first event to the failure: the incident trace "
    "starts KEEP (and up to a rotation) before the failure, the full one at the start",
}
"""Fields of an incident that legitimately differ between the incident trace and the
full trace, and why; every other field must be equal."""


def seconds(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    return float(text[:-1]) * units[text[-1]] if text[-1] in units else float(text)


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


SAMPLE_HEADER = f"{'t s':>6} {'cpu s/s':>8} {'disk MiB':>9}"


def sample(pid: int, out: Path, t: float, last_cpu: float,
           every: float) -> tuple[float, int] | None:
    """The recorder's CPU seconds and the trace's bytes now, printed as one row under
    SAMPLE_HEADER (CPU per second since `last_cpu`); None once the recorder is gone."""
    try:
        cpu = cpu_s(pid)
    except (FileNotFoundError, ProcessLookupError):
        return None
    size = du(out)
    print(f"{t:6.0f} {(cpu - last_cpu) / every:8.3f} {size / 2**20:9.1f}", flush=True)
    return cpu, size


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


def mine(out: Path, oom_pid: int) -> tuple[list[dict[str, Any]], list[str]]:
    """The flight trace's incidents triggered by the OOM program (pid `oom_pid`), and a
    line for each other one: host mode records every process, and on a shared machine
    other people's stand-in programs fail allocations too."""
    m = json.loads((out / "manifest.json").read_text())
    ours, others = [], []
    for i in m.get("incidents", []):
        d = json.loads((out / i["dir"] / "manifest.json").read_text())["window"]["detail"]
        if d.get("pid") == oom_pid:
            ours.append(i)
        else:
            others.append(f"{i['dir']}: pid {d.get('pid')} {d.get('comm')} {d.get('call')} "
                          f"{d.get('requested_bytes')} bytes")
    return ours, others


def failure_ts(inc_dir: Path, oom_pid: int) -> int:
    from gputrace.trace.reader import open_trace

    calls = open_trace(inc_dir).scan("cuda_calls").collect()
    return int(calls.filter((calls["result"] == 2) & (calls["pid"] == oom_pid))["ts_ns"][0])


def compare(work: Path) -> bool:
    """The incident trace's oom report against the snapshot's, for the OOM program's
    incident (matched by its failure's ts_ns: either trace may hold other processes')."""
    out = work / "flight"
    oom_pid = int((work / "oom.pid").read_text())
    ours, _ = mine(out, oom_pid)
    inc_dir = out / ours[0]["dir"]
    at = failure_ts(inc_dir, oom_pid)
    here = analyze_oom(inc_dir, work / "incident-oom.json")
    full = analyze_oom(work / "snapshot", work / "full-oom.json")
    a = [i for i in find_incidents(here) if i["ts_ns"] == at]
    b = [i for i in find_incidents(full) if i["ts_ns"] == at]
    print(f"incidents in the reports: incident trace {len(find_incidents(here))}, full "
          f"trace {len(find_incidents(full))}; of the OOM program: {len(a)}, {len(b)}")
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


KEPT_WHOLE = ("stacks", "processes")
"""Tables the window does not cut by time (docs/flight-recorder.md): `stacks` has no
time, `processes` rows of running processes stay. They grow with distinct stacks and
processes, not with time, and are counted apart."""


def parts_now(out: Path, seen: dict[str, tuple[float, int]]) -> tuple[int, int, float]:
    """(bytes of the time-bound parts on disk now, of the kept-whole ones, age of the
    oldest time-bound part in s, by mtime: a part is written once, at its rotation);
    every time-bound part seen is remembered in `seen`."""
    held, whole, oldest, now = 0, 0, 0.0, time.time()
    for f in files(out):
        if not f.name.startswith("part-"):
            continue
        with contextlib.suppress(FileNotFoundError):  # deleted by the recorder meanwhile
            st = f.lstat()
            if f.parent.name in KEPT_WHOLE:
                whole += st.st_size
                continue
            seen[str(f)] = (st.st_mtime, st.st_size)
            held += st.st_size
            oldest = max(oldest, now - st.st_mtime)
    return held, whole, oldest


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
    print(SAMPLE_HEADER, flush=True)
    last_cpu, peak, oom_wall, snapped, oom_pid = cpu_s(pid), 0, None, False, 0
    seen: dict[str, tuple[float, int]] = {}
    samples: list[tuple[float, int, int, float]] = []  # wall, held, kept whole, oldest age
    while rec.proc.poll() is None:
        time.sleep(args.every)
        t = time.monotonic() - t0
        if args.oom_at is not None and oom_wall is None and t >= args.oom_at:
            p = subprocess.Popen([str(oom)], stdout=subprocess.PIPE, text=True)
            said, _ = p.communicate(timeout=60)
            oom_wall, oom_pid = time.monotonic() - t0, p.pid
            (work / "oom.pid").write_text(str(oom_pid))
            print(f"{oom_wall:6.0f} OOM program pid {oom_pid}: rc {p.returncode} "
                  f"{said.strip()}", flush=True)  # fmt: skip
        # after the incident is frozen, while the window still holds the failure
        if oom_wall is not None and not snapped and \
                t >= oom_wall + after_s + min(5.0, (keep_s - after_s) / 2):  # fmt: skip
            n = snapshot(out, snap)
            snapped = True
            print(f"{t:6.0f} snapshot: {n} files hard-linked", flush=True)
        now = sample(pid, out, t, last_cpu, args.every)
        if now is None:
            break
        last_cpu, size = now
        peak = max(peak, size)
        held, whole, oldest = parts_now(out, seen)
        if storm.poll() is None:  # without events no part is written, none deleted
            samples.append((time.time(), held, whole, oldest))
    rc = rec.wait(600)
    storm_out, _ = storm.communicate(timeout=60)
    print(f"recorder rc {rc}; storm {storm_out.strip()} (rc {storm.returncode})")
    if rc != 0:
        print("".join(rec.stderr), file=sys.stderr)
        return 1
    (work / "samples.json").write_text(json.dumps({"samples": samples, "parts": seen}))
    m = json.loads((out / "manifest.json").read_text())
    win = m["window"]
    print("window", json.dumps(win, sort_keys=True))
    print("drops", json.dumps(m.get("drops"), sort_keys=True))
    # the bytes a second while the storm ran (paced: its average rate holds over its
    # scheduled seconds); before and after it the recorder writes next to nothing
    # The bound: at every sample the time-bound parts held are at most the bytes of the
    # parts written (by mtime) in the last KEEP + 3 rotations (a part is deleted once
    # its newest row is older than the trace's newest minus KEEP; it was written up to
    # a rotation after that row, and the sample falls anywhere in the next rotation),
    # and none is older than that. The write rate is not constant in host mode (other
    # people's programs on this machine add rows), so the bound is taken per sample
    # from what was written, not from an average. `stacks` and `processes` apart.
    rot = win["rotate_s"]
    span = keep_s + 3 * rot
    worst, oldest_age, whole_max = 0.0, 0.0, 0
    for ts, held, whole, oldest in samples:
        written = sum(sz for mt, sz in seen.values() if ts - span < mt <= ts)
        worst = max(worst, held / max(written, 1))
        oldest_age = max(oldest_age, oldest)
        whole_max = max(whole_max, whole)
    disk_ok = worst <= 1.0 and oldest_age <= span + args.every
    total = win["held_bytes"] + win["deleted_bytes"]
    print(f"disk: peak {peak / 2**20:.2f} MiB (recorder's peak_held_bytes "
          f"{win['peak_held_bytes'] / 2**20:.2f} MiB), final {du(out) / 2**20:.2f} MiB; "
          f"{total / 2**20:.1f} MiB written in all ({len(seen)} time-bound parts); per sample, "
          f"parts held / parts written in the last {span:.0f} s: at most {worst:.3f}; "
          f"stacks + processes at most {whole_max / 2**10:.0f} KiB; oldest time-bound part "
          f"held {oldest_age:.1f} s old (bound {span:.0f} s + the {args.every:.0f} s "
          f"sampling); within: {disk_ok}")
    if args.oom_at is None:  # the disk bound alone
        return 0 if disk_ok else 1
    ours, others = mine(out, oom_pid)
    for o in others:
        print("  incident of another process:", o)
    one_ok = len(ours) == 1 and ours[0]["status"] == "kept"
    print(f"incidents: {len(ours)} of the OOM program (pid {oom_pid}), {len(others)} of "
          f"other processes; exactly one kept: {one_ok}")
    if not one_ok:
        return 1
    from gputrace.trace.reader import open_trace

    inc = open_trace(out / ours[0]["dir"])
    iw = inc.manifest["window"]
    at = failure_ts(out / ours[0]["dir"], oom_pid)
    its = inc.scan("ioctls").collect()["ts_ns"]
    win_ok = iw["from_ts_ns"] <= at - keep_s * 1e9 and iw["to_ts_ns"] >= at + after_s * 1e9
    print(
        f"incident window: from {(iw['from_ts_ns'] - at) / 1e9:+.3f} s to "
        f"{(iw['to_ts_ns'] - at) / 1e9:+.3f} s of the failure; its ioctls "
        f"{(its.min() - at) / 1e9:+.3f} s to {(its.max() - at) / 1e9:+.3f} s "
        f"({its.len():,} rows); covers [-{keep_s:.0f} s, +{after_s:.0f} s]: {win_ok}"
    )
    same = compare(work) if snapped else False
    print(f"ALL: disk {disk_ok}, one incident {one_ok}, window {win_ok}, report {same}")
    return 0 if disk_ok and one_ok and win_ok and same else 1
