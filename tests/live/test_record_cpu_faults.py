"""CPU page faults on managed memory: live recordings of
tests/standin/fault_workload.c on the FUSE stand-in (root, bcc, FUSE, x86-64)."""

from __future__ import annotations

import platform
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from gputrace.record.cpu_faults import managed_ranges as cpufaults
from gputrace.trace.reader import open_trace
from tests.record_helpers import (
    ROOT,
    RecorderProc,
    live_skip_reason,
    record_cmd,
    standin_driver_args,
)

pytestmark = [pytest.mark.live]
_SKIP = live_skip_reason()
if _SKIP is None and platform.machine() != "x86_64":
    _SKIP = "exceptions:page_fault_user is x86-64 only"
if _SKIP is not None:
    pytestmark.append(pytest.mark.skip(reason=_SKIP))

DRIVER = standin_driver_args()
BLOCK = 2 << 20


def _want(exp: dict[str, Any]) -> Counter[tuple[int, str]]:
    out: Counter[tuple[int, str]] = Counter()
    for p in exp["pages"]:
        out[(p["address"], "read")] += p["reads"]
        out[(p["address"], "write")] += p["writes"]
    return +out


def _per_block(exp: dict[str, Any]) -> dict[int, tuple[int, int, int]]:
    out: dict[int, list[int]] = {}
    for p in exp["pages"]:
        b = out.setdefault(p["address"] - p["address"] % BLOCK, [0, 0, 0])
        b[0] += p["reads"] + p["writes"]
        b[1] += p["reads"]
        b[2] += p["writes"]
    return {k: (v[0], v[1], v[2]) for k, v in out.items()}


def _blocks_of(faults: pl.LazyFrame) -> dict[int, tuple[int, int, int]]:
    """Per-block counts from the fault-rate analysis
    (gputrace.analyses.fault_rate.cpu_faults.cpu_blocks) when it is there,
    else the same group_by here."""
    try:
        from gputrace.analyses.fault_rate.cpu_faults import cpu_blocks
    except ImportError:  # pragma: no cover - analyses not present
        cpu_blocks = None
    if cpu_blocks is not None:
        df = cpu_blocks(faults).collect()
    else:  # pragma: no cover
        df = (faults.group_by("pid", "block_2m").agg(
            pl.len().alias("faults"), (pl.col("access_type") == "read").sum().alias("reads"),
            (pl.col("access_type") == "write").sum().alias("writes")).collect())  # fmt: skip
    return {r["block_2m"]: (r["faults"], r["reads"], r["writes"])
            for r in df.iter_rows(named=True)}  # fmt: skip


def _check(out: Path, pid: int | None, exp: dict[str, Any]) -> None:
    t = open_trace(out)
    assert t.status == "complete"
    assert cpufaults.LAYER in t.layers
    assert "exceptions:page_fault_user" in t.manifest["hooks"]["attached"]
    assert "x86-64 only" in t.manifest["hooks"]["notes"]["exceptions:page_fault_user"]
    assert sum(t.drops.values()) == 0 and t.drops["fault_events"] == 0
    assert t.manifest["cpu_faults"] == {"untracked_blocks": 0, "untracked_ranges": 0}
    f = t.scan("faults").collect()
    if pid is not None:
        assert set(f["pid"].to_list()) == {pid}
    assert set(f["source"].to_list()) == {"cpu"}
    assert set(f["fault_type"].to_list()) == {"unknown"}
    assert f["gpu_index"].is_null().all() and (f["ip"] > 0).all()
    assert (f["block_2m"] == f["address"] - f["address"] % BLOCK).all()
    got = Counter(zip(f["address"].to_list(), f["access_type"].to_list(), strict=True))
    assert got == _want(exp)  # exact per page and kind; nothing outside the ranges
    assert not set(f["address"].to_list()) & set(exp["outside"])
    assert f.height == exp["faults"]
    assert (f["access_type"] == "read").sum() == exp["reads"]
    assert (f["access_type"] == "write").sum() == exp["writes"]
    blocks = _blocks_of(t.scan("faults"))
    assert blocks == _per_block(exp)


def test_faults_command_exact(tmp_path: Path) -> None:
    from tests.standin import fault_workload
    from tests.standin.standin import mounted_driver

    exp = fault_workload.expected()
    wl = fault_workload.build()
    out = tmp_path / "trace"
    with mounted_driver(tmp_path, budget=1 << 30) as dev:
        r = subprocess.run(
            record_cmd(out, "--device-dir", str(dev), *DRIVER, "--", str(wl), str(dev)),
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout == "DONE\n"
    _check(out, None, exp)
    maps = open_trace(out).scan("mappings").collect()
    managed = maps.filter(pl.col("managed")).sort("addr")
    assert managed.select("addr", "length").rows() == [
        (m["address"], m["length"]) for m in exp["managed_ranges"]]  # fmt: skip


def test_faults_attach_seeds_ranges_from_maps(tmp_path: Path) -> None:
    """Both ranges are mapped before the recorder starts: it must find them in
    /proc/PID/maps (and follow the later munmap and MAP_FIXED changes)."""
    from tests.standin import fault_workload
    from tests.standin.standin import mounted_driver

    exp = fault_workload.expected()
    out = tmp_path / "trace"
    with mounted_driver(tmp_path, budget=1 << 30) as dev, fault_workload.waiting(dev) as wl:
        rec = RecorderProc(record_cmd(out, "-p", str(wl.pid), "--device-dir", str(dev), *DRIVER))
        rec.wait_ready()
        rc, stdout, err = wl.go()
        assert rc == 0 and stdout == "DONE\n", err
        assert rec.wait(timeout=60) == 0, "".join(rec.stderr)
    _check(out, wl.pid, exp)
