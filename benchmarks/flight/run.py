#!/usr/bin/env python3
"""The flight recorder's steady state against plain `record`: recorder CPU and
disk while a paced ioctl storm runs. Not a CI test. Run as root from the
repository root:

    python3 benchmarks/flight/run.py                        # 150 s, --keep 30s, 100 k/s
    python3 benchmarks/flight/run.py --seconds 600 --keep 1m

`gputrace record` runs `benchmarks/longrun/paced.c` as its command (--rate
RM_CONTROL ioctls a second on a mknod copy of /dev/null named nvidiactl), once
plain and once with `--keep KEEP --freeze-on oom` (the storm never fails an
allocation: no incident, the detector's cost only). Every --every seconds it
prints the recorder's CPU since the last line and the trace's bytes on disk
(incidents excluded); at the end, per mode, the CPU per second, the peak and final
disk, and for the flight recording its manifest's `window`.

    python3 benchmarks/flight/run.py --host --seconds 600 --keep 1m --after 10s \
        --oom-at 420 --rate 50000 --workdir /tmp/flight-oom

records in host mode instead (no command; the storm and, at --oom-at, a program
asking the stand-in libcuda for 1 TiB run beside it) and checks the disk bound, the
one incident trace, its window and its `oom` report: see flight_oom.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from common import build_storm, cpu_s, start_recorder  # noqa: E402
from flight_oom import SAMPLE_HEADER, du, host_oom, sample  # noqa: E402


def one(tmp: Path, paced: Path, args: argparse.Namespace, flight: list[str]) -> dict[str, float]:
    dev = tmp / "dev"
    out = tmp / ("flight" if flight else "plain")
    rec = start_recorder(out, "--device-dir", str(dev), "--no-driver-layer", *flight, "--",
                         str(paced), str(dev), str(args.rate), str(args.seconds))
    pid, t0 = rec.proc.pid, time.monotonic()
    last_cpu, peak, cpu_first = cpu_s(pid), 0, None
    print(f"\n{'flight ' + ' '.join(flight) if flight else 'plain record'}")
    print(SAMPLE_HEADER)
    while rec.proc.poll() is None:
        time.sleep(args.every)
        t = time.monotonic() - t0
        now = sample(pid, out, t, last_cpu, args.every)
        if now is None:
            break
        last_cpu, size = now
        peak = max(peak, size)
        if cpu_first is None and t >= args.every * 2:
            cpu_first = (t, last_cpu)  # steady state: after warm-up
    t_end = time.monotonic() - t0
    rc = rec.wait(600)
    assert rc == 0, "".join(rec.stderr)
    m = json.loads((out / "manifest.json").read_text())
    steady = (last_cpu - cpu_first[1]) / max(t_end - cpu_first[0], 1) if cpu_first else 0.0
    res = {"cpu_s_per_s": steady, "peak_mib": peak / 2**20, "final_mib": du(out) / 2**20,
           "rows": m["tables"].get("ioctls", {}).get("rows", 0)}
    print(f"steady CPU {steady:.3f} s/s; disk peak {res['peak_mib']:.1f} MiB, final "
          f"{res['final_mib']:.1f} MiB; ioctls held {res['rows']:,}; drops {m.get('drops')}")
    if "window" in m:
        print("window", json.dumps(m["window"], sort_keys=True))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=int, default=150)
    ap.add_argument("--keep", default="30s")
    ap.add_argument("--rate", type=int, default=100_000)
    ap.add_argument("--every", type=float, default=5.0)
    ap.add_argument("--only-flight", action="store_true")
    ap.add_argument("--host", action="store_true",
                    help="record in host mode (no command) with --freeze-on oom --after AFTER")
    ap.add_argument("--oom-at", type=float, default=None,
                    help="with --host: seconds in, a program asks the stand-in libcuda for 1 TiB")
    ap.add_argument("--after", default="10s")
    ap.add_argument("--workdir", type=Path, default=None,
                    help="with --host: keep the traces and reports here (else a temporary dir)")
    ap.add_argument("--compare-only", action="store_true",
                    help="with --host --workdir: redo the report comparison of a finished run")
    args = ap.parse_args()
    if args.host:
        sys.exit(host_oom(args, HERE.parent / "longrun" / "paced.c"))
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "dev").mkdir()
        os.mknod(tmp / "dev" / "nvidiactl", 0o666 | 0o020000, os.makedev(1, 3))
        paced = build_storm(HERE.parent / "longrun" / "paced.c", tmp)
        plain = None if args.only_flight else one(tmp, paced, args, [])
        fl = one(tmp, paced, args, ["--keep", args.keep, "--freeze-on", "oom"])
        if plain:
            ratio = fl["cpu_s_per_s"] / max(plain["cpu_s_per_s"], 1e-9)
            print(f"\nflight / plain: CPU {ratio:.2f}x, final disk "
                  f"{fl['final_mib']:.1f} vs {plain['final_mib']:.1f} MiB")


if __name__ == "__main__":
    main()
