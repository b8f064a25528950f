#!/usr/bin/env python3
"""What do the live paths cost the recorder? The ioctl storm (benchmarks/ioctl_storm)
recorded plainly and with `--live --metrics` (the view on a pseudo-terminal, the
endpoint scraped once a second as Prometheus would), alternating, best of N.
Run as root from the repository root:

    python3 benchmarks/live/run.py [--calls 2000000] [--rounds 2]

Prints, per mode: ns per ioctl in the storm, recorder CPU ns per event, events/s,
events recorded, drops; then the added cost per event and the rate ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE.parent))

from common import build_storm  # noqa: E402
from ioctl_storm.run import cpu_of, parse  # noqa: E402

READY = "gputrace: recording ("


def run_once(storm: Path, dev: Path, n: int, out: Path, live: bool) -> dict[str, float]:
    w = subprocess.Popen([str(storm), str(dev), str(n), "--wait"], text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
    assert w.stdout is not None and w.stdin is not None
    pid = int(w.stdout.readline().split()[1])
    argv = [sys.executable, "-m", "gputrace.cli", "record", "-o", str(out), "--force",
            "--device-dir", str(dev), "-p", str(pid)]
    master = slave = -1
    if live:
        argv += ["--live", "--metrics", "127.0.0.1:0"]
        master, slave = pty.openpty()
    rec = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.DEVNULL,
                           stdout=slave if live else subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)  # fmt: skip
    ready = threading.Event()
    if live:
        os.close(slave)
        # the view shows the recorder's stderr lines (the ready line among them); the
        # rest of its output is read and thrown away, as a terminal would show it
        threading.Thread(target=_drain, args=(master, ready), daemon=True).start()
    assert rec.stderr is not None
    url = None
    lines: list[str] = []
    for line in rec.stderr:
        lines.append(line)
        if "gputrace: metrics on " in line:
            url = line.split("gputrace: metrics on ")[1].split()[0]
        if READY in line or (live and url is not None):
            break
    else:
        raise RuntimeError("recorder exited: " + "".join(lines))
    if live and not ready.wait(120):
        raise RuntimeError("the live recorder never showed its ready line")
    threading.Thread(target=lambda: [*rec.stderr], daemon=True).start()  # type: ignore[misc]
    stop = threading.Event()
    scrapes = [0]
    if url is not None:
        threading.Thread(target=_scraper, args=(url, stop, scrapes), daemon=True).start()
    c0 = cpu_of(rec.pid)
    t0 = time.monotonic()
    w.stdin.write("go\n")
    w.stdin.flush()
    per_call = parse(w.communicate()[0])
    storm_wall = time.monotonic() - t0
    _, status, ru = os.wait4(rec.pid, 0)
    stop.set()
    cpu = ru.ru_utime + ru.ru_stime - c0
    from gputrace.trace.reader import open_trace

    t = open_trace(out)
    rows = t.rows("ioctls")
    return {"ns_per_call": per_call, "events": rows, "drops": sum(t.drops.values()),
            "events_per_s": rows / storm_wall, "cpu_ns_per_event": cpu / max(rows, 1) * 1e9,
            "scrapes": scrapes[0], "exit": os.waitstatus_to_exitcode(status)}  # fmt: skip


def _drain(fd: int, ready: threading.Event) -> None:
    seen = b""
    try:
        while data := os.read(fd, 65536):
            if not ready.is_set():
                seen = seen[-200:] + data
                if READY.encode() in seen:
                    ready.set()
    except OSError:
        pass


def _scraper(url: str, stop: threading.Event, count: list[int]) -> None:
    while not stop.wait(1.0):
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                r.read()
            count[0] += 1
        except OSError:
            return


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2_000_000)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    res: dict[str, list[dict[str, float]]] = {"plain": [], "live": []}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        dev = tmp / "dev"
        dev.mkdir()
        os.mknod(dev / "nvidiactl", 0o666 | 0o020000, os.makedev(1, 3))
        storm = build_storm(ROOT / "benchmarks" / "ioctl_storm" / "storm.c", tmp)
        for _ in range(a.rounds):
            for mode in ("plain", "live"):
                res[mode].append(run_once(storm, dev, a.calls, tmp / mode, mode == "live"))
    best = {m: min(r, key=lambda x: x["cpu_ns_per_event"]) for m, r in res.items()}
    p, lv = best["plain"], best["live"]
    print(json.dumps(res, indent=1))
    print(f"plain: {p['ns_per_call']:.0f} ns/ioctl, recorder {p['cpu_ns_per_event']:.0f} ns "
          f"CPU/event, {p['events_per_s'] / 1e6:.2f} M events/s, {p['events']:.0f} events, "
          f"{p['drops']:.0f} drops")
    print(f"live:  {lv['ns_per_call']:.0f} ns/ioctl, recorder {lv['cpu_ns_per_event']:.0f} ns "
          f"CPU/event, {lv['events_per_s'] / 1e6:.2f} M events/s, {lv['events']:.0f} events, "
          f"{lv['drops']:.0f} drops, {lv['scrapes']:.0f} scrapes")
    added = lv["cpu_ns_per_event"] - p["cpu_ns_per_event"]
    print(f"added recorder CPU per event: {added:+.0f} ns "
          f"({added / p['cpu_ns_per_event']:+.1%}); lossless rate ratio live/plain: "
          f"{lv['events_per_s'] / p['events_per_s']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
