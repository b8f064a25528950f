"""Spilling under a real ioctl storm (live): events that arrive faster than
GPUTRACE_SPILL_MIB a second are written raw and decoded when the recording ends,
and the trace holds every ioctl, exactly as a recording that decoded them as they
came. The storm (benchmarks/ioctl_storm/storm.c) issues N RM_CONTROL ioctls on a
`nvidiactl` that is a mknod copy of /dev/null: known content, no driver needed."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import polars as pl
import pytest

from gputrace.trace.reader import open_trace
from tests.record_helpers import ROOT, RUN_S, live_skip_reason, record_cmd

# exclusive: the decoded recording of the storm must keep up with it, no drops, so no
# other test (pytest-xdist worker) competes for the CPUs meanwhile
pytestmark = [pytest.mark.live, pytest.mark.exclusive]
_SKIP = live_skip_reason()
if _SKIP is not None:
    pytestmark.append(pytest.mark.skip(reason=_SKIP))

STORM = ROOT / "benchmarks" / "ioctl_storm" / "storm.c"
CALLS = 300_000
# what storm.c sends (struct nvos54 and the request word)
CMD, H_CLIENT, H_OBJECT, CTRL = 0xC020462A, 0xC1D00001, 0x5C000001, 0x00800280


@pytest.fixture(scope="module")
def storm(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("storm")
    exe = tmp / "storm"
    subprocess.run(["gcc", "-O2", "-o", str(exe), str(STORM)], check=True)
    dev = tmp / "dev"
    dev.mkdir()
    os.mknod(dev / "nvidiactl", 0o666 | 0o020000, os.makedev(1, 3))
    return exe, dev


def _record(tmp: Path, storm: tuple[Path, Path], spill_mib: str) -> tuple[Path, str]:
    exe, dev = storm
    out = tmp / f"trace-{spill_mib}"
    r = subprocess.run(
        record_cmd(out, "--device-dir", str(dev), "--no-driver-layer", "--",
                   str(exe), str(dev), str(CALLS)),
        cwd=ROOT, capture_output=True, text=True, timeout=RUN_S,
        env={**os.environ, "GPUTRACE_SPILL_MIB": spill_mib},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert f"calls {CALLS}" in r.stdout
    return out, r.stderr


def _check_every_ioctl(out: Path) -> pl.DataFrame:
    t = open_trace(out)
    assert t.status == "complete" and sum(t.drops.values()) == 0
    io = t.scan("ioctls").collect()
    assert io.height == CALLS
    assert io.select("name", "cmd", "h_client", "h_object", "ctrl_cmd", "device").unique().rows() \
        == [("RM_CONTROL", CMD, H_CLIENT, H_OBJECT, CTRL, "ctl")]  # fmt: skip
    procs = t.scan("processes").collect()
    assert io["pid"].unique().to_list() == procs["pid"].to_list()  # the storm, one row
    assert procs["comm"].to_list() == ["storm"]
    return io


def test_storm_spilled_and_decoded_at_the_end(tmp_path: Path,
                                              storm: tuple[Path, Path]) -> None:  # fmt: skip
    # 1 MiB a second: the storm (>100 k ioctls/s, 168 bytes each) is far above it
    out, err = _record(tmp_path, storm, "1")
    m = json.loads((out / "manifest.json").read_text())
    assert m["spilled"]["ioctls"] >= 1, m.get("spilled")
    assert "parts written undecoded while the recorder was behind" in err
    assert "rows) in" in err and "decoded" in err
    assert not list((out / "ioctls").glob("part-*.gtraw"))
    assert m["tables"]["ioctls"]["rows"] == CALLS and "raw_parts" not in m["tables"]["ioctls"]
    spilled = _check_every_ioctl(out)
    # the same storm decoded as it came: the same rows but for times and latencies
    out2, err2 = _record(tmp_path, storm, "65536")
    m2 = json.loads((out2 / "manifest.json").read_text())
    assert "spilled" not in m2 and "raw_tables" not in m2 and "decoded" not in err2
    decoded = _check_every_ioctl(out2)
    same = [c for c in spilled.columns if c not in ("ts_ns", "latency_ns", "pid", "tid")]
    assert spilled.select(same).sort(same).equals(decoded.select(same).sort(same))
