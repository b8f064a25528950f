"""Lost events are counted from every ring buffer, and every report says so.

Two of the named mutants of docs/testing.md are killed here: the drops warning
switched off in `gputrace info`, and lost events counted from one ring buffer only
(the recorder's per-buffer, per-CPU drop counters; the reports' sums)."""

from __future__ import annotations

import ctypes
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gputrace.trace.builder import MiB, TraceBuilder
from tests.analyze_helpers import analyze
from tests.cli_helpers import cli

DROPS = {"ioctl_events": 12, "fault_events": 5, "cuda_events": 3}  # 20 in all


@pytest.fixture(scope="module")
def dropped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    b = TraceBuilder(drops=DROPS)
    b.process(1, "x")
    b.rm_alloc(0.0, 1, size=MiB)
    return b.build(tmp_path_factory.mktemp("drops") / "t")


def _info(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return cli("info", str(path), *args)


def test_info_warns_about_drops(dropped: Path) -> None:
    """`gputrace info` prints a warning with the total and each buffer that lost events."""
    r = _info(dropped)
    assert r.returncode == 0, r.stderr
    warn = [ln for ln in (r.stdout + r.stderr).splitlines()
            if ln.startswith("warning") and "dropped" in ln]
    assert len(warn) == 1, r.stdout
    assert "20 events" in warn[0]
    for name, n in DROPS.items():
        assert f"{name}={n}" in warn[0]


def test_info_json_warns_about_drops(dropped: Path) -> None:
    info = json.loads(_info(dropped, "--json").stdout)
    assert info["drops"] == DROPS
    assert [w for w in info["warnings"] if "dropped" in w and "20" in w]


def test_info_without_drops_has_no_drops_warning(tmp_path: Path) -> None:
    b = TraceBuilder(drops={"ioctl_events": 0})
    b.process(1, "x")
    r = _info(b.build(tmp_path / "t"))
    assert "dropped" not in r.stdout + r.stderr


def test_reports_sum_lost_events_over_every_buffer(dropped: Path) -> None:
    doc = analyze(dropped)
    for key in ("leaks", "fault_rate", "fragmentation", "summary"):
        text = " ".join(doc[key]["warnings"])
        assert "20 events were dropped" in text, key
        for name, n in DROPS.items():
            assert f"{name}={n}" in text, (key, name)


class _PerCpu:
    """A bcc per-CPU array: table[c_int(i)] is the list of per-CPU values of slot i."""

    def __init__(self, slots: list[list[int]]) -> None:
        self.slots = slots

    def __getitem__(self, key: ctypes.c_int) -> list[int]:
        return self.slots[key.value]


def test_probe_drops_counted_from_every_ring_buffer() -> None:
    """Every GT_BUF_* slot of the `drops` map, summed over CPUs, under its buffer name."""
    from gputrace.record import loader

    n = len(loader.BUFFERS)
    slots = [[(i + 1) * 10 + cpu for cpu in range(4)] for i in range(n)]
    probes: Any = object.__new__(loader.Probes)
    probes.bpf = {"drops": _PerCpu(slots)}
    assert probes.drops() == {name: sum(slots[i]) for i, name in enumerate(loader.BUFFERS)}


def test_api_drops_counted() -> None:
    from gputrace.record.api import libcuda as cuda

    api: Any = object.__new__(cuda.LibcudaProbes)
    api.bpf = {"cuda_drops": _PerCpu([[4, 5, 6]])}
    assert api.drops() == {"cuda_events": 15}
