"""The flight recorder live (`record --keep`, `--freeze-on oom`): an ioctl storm
of ~20 s recorded with a 5 s window stays within it on disk (measured while it
runs), the old parts are gone, and a cuMemAlloc_v2 of 1 TiB failing with
CUDA_ERROR_OUT_OF_MEMORY in the middle (the stand-in libcuda refuses anything
over GPUTRACE_STANDIN_CUDA_MAX, 1 GiB by default) yields one incident trace
holding the window before it and the seconds after, analyzable alone."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gputrace.trace.reader import open_trace
from tests.record_helpers import ROOT, RUN_S, RecorderProc, live_skip_reason, record_cmd

pytestmark = [pytest.mark.live, pytest.mark.exclusive]
_SKIP = live_skip_reason()
if _SKIP is not None:
    pytestmark.append(pytest.mark.skip(reason=_SKIP))

STORM = ROOT / "benchmarks" / "ioctl_storm" / "storm.c"
TIB = 1 << 40
KEEP_S, AFTER_S = 5, 2
BURSTS = 40  # storm bursts of CALLS ioctls, 0.5 s apart: ~20 s in all
CALLS = 5000
OOM_AT = 20  # the failing allocation comes after this many bursts (~10 s in)


def _du(path: Path, skip: str = "incidents") -> int:
    total = 0
    for root, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if d != skip]
        for f in files:
            with contextlib.suppress(FileNotFoundError):  # deleted by the recorder meanwhile
                total += os.lstat(os.path.join(root, f)).st_size
    return total


def test_flight_recorder_window_and_oom_incident(tmp_path: Path) -> None:
    from tests.standin_cuda.standin_cuda import HERE, build, link_program

    paths = build()
    oom = link_program(HERE / "oom_program.c", tmp_path / "oom")
    storm = tmp_path / "storm"
    subprocess.run(["gcc", "-O2", "-o", str(storm), str(STORM)], check=True)
    dev = tmp_path / "dev"
    dev.mkdir()
    os.mknod(dev / "nvidiactl", 0o666 | 0o020000, os.makedev(1, 3))
    burst = f"{storm} {dev} {CALLS} >/dev/null; sleep 0.5"
    script = (f"i=0; while [ $i -lt {BURSTS} ]; do {burst}; i=$((i+1)); "
              f"if [ $i -eq {OOM_AT} ]; then {oom}; fi; done")  # fmt: skip
    out = tmp_path / "flight"
    rec = RecorderProc(record_cmd(out, "--device-dir", str(dev), "--no-driver-layer",
                                  "--libcuda", str(paths.libcuda), "--keep", f"{KEEP_S}s",
                                  "--freeze-on", "oom", "--after", f"{AFTER_S}s",
                                  "--", "sh", "-c", script))  # fmt: skip
    rec.wait_ready()
    sizes = []
    while rec.proc.poll() is None:  # the disk used, every half second
        sizes.append(_du(out))
        time.sleep(0.5)
    assert rec.wait(RUN_S) == 0, "".join(rec.stderr)
    m = json.loads((out / "manifest.json").read_text())
    win = m["window"]
    written = win["held_bytes"] + win["deleted_bytes"]
    # ~20 s written, a 5 s window (plus a rotation being written) held at any time
    assert win["deleted_parts"] > 0 and win["keep_ns"] == KEEP_S * 10**9
    assert max(sizes) < written * 0.6, (sizes, written)
    t = open_trace(out)
    ioctls = t.scan("ioctls").collect()
    assert ioctls["ts_ns"].min() >= win["from_ts_ns"]
    # the held events span the window and one rotation more, no more
    assert ioctls["ts_ns"].max() - ioctls["ts_ns"].min() <= (KEEP_S + 2) * 10**9
    assert len(list((out / "ioctls").glob("part-*.parquet"))) == m["tables"]["ioctls"]["parts"]
    assert not [w for w in t.warnings() if "manifest announces" in w]
    # one incident, holding the failed allocation, the window before it and after it
    assert [i["trigger"] for i in m["incidents"]] == ["oom"]
    assert m["incidents"][0]["status"] == "kept"
    inc_dir = out / m["incidents"][0]["dir"]
    inc = open_trace(inc_dir)
    iw = inc.manifest["window"]
    calls = inc.scan("cuda_calls").collect()
    failed = calls.filter(calls["result"] == 2)
    assert failed["func"].to_list() == ["cuMemAlloc_v2"]
    assert failed["size_bytes"].to_list() == [TIB]
    at = failed["ts_ns"][0]
    assert iw["incident_ts_ns"] == at and iw["to_ts_ns"] == at + AFTER_S * 10**9
    assert iw["detail"]["requested_bytes"] == TIB and iw["detail"]["call"] == "cuMemAlloc_v2"
    its = inc.scan("ioctls").collect()["ts_ns"]
    assert at - its.min() >= (KEEP_S - 1) * 10**9  # the window before
    assert its.max() - at >= (AFTER_S - 1) * 10**9  # and the seconds after
    assert not [w for w in inc.warnings() if "manifest announces" in w]
    r = subprocess.run([sys.executable, "-m", "gputrace.cli", "analyze", str(inc_dir)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "incident window" in r.stdout + r.stderr
    info = subprocess.run([sys.executable, "-m", "gputrace.cli", "info", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert info.returncode == 0 and "incident   incidents/" in info.stdout
    assert "window     keeps the last 5s" in info.stdout
