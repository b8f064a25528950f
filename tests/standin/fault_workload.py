"""TEST STAND-IN helpers for the CPU page-fault workload: build it, ask
it what it touches, run it or start it stopped before its touches.

``fault_workload DEVDIR [--wait]`` maps the stand-in's nvidia-uvm as two managed
ranges and touches a known pattern of pages (see fault_workload.c);
``--print-expected`` describes the faults a tracer must record.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.standin.standin import (
    BUILD_DIR,
    HERE,
    StandinUnavailable,
    WaitingWorkload,
    print_expected,
    started_waiting,
)

BINARY = BUILD_DIR / "fault_workload"


def build() -> Path:
    r = subprocess.run(["make", "-C", str(HERE), "build/fault_workload"], capture_output=True,
                       text=True, check=False)  # fmt: skip
    if r.returncode != 0:
        raise StandinUnavailable(f"building fault_workload failed:\n{r.stdout}{r.stderr}")
    return BINARY


def expected() -> dict[str, Any]:
    """The pattern: managed_ranges, pages (address, op, reads, writes), outside, totals."""
    return print_expected(build())


def run(devdir: Path | str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(build()), str(devdir)], capture_output=True, text=True,
                          timeout=timeout, check=True)  # fmt: skip


@contextlib.contextmanager
def waiting(devdir: Path | str, timeout: float = 30.0) -> Iterator[WaitingWorkload]:
    """Start it with --wait (both ranges mapped, nothing touched) and yield at READY."""
    with started_waiting([str(build()), str(devdir), "--wait"], timeout=timeout) as w:
        yield w
