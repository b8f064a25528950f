"""TEST SCENARIO for the FUSE stand-in: out-of-memory failures of both kinds on one
GPU with known holders, the planted truth written by the scenario itself.

GPU 0 of a stand-in mounted with budget BUDGET_MIB (first-fit heap, 2 MiB pages):

    pre   (started before the recording; `Holder`) holds PRE_MIB at [0, 256)
    p1    holds P1_MIB at [256, 384)
    p2    allocates 8 x 64 MiB at [384, 896), frees blocks 0, 2, 4, 6: holes of 64 MiB
          at 384, 512, 640, 768; the tail [896, 1024) is the largest free region
    then  p1 asks for CAPACITY_MIB > free (384 MiB): NV_ERR_NO_MEMORY, capacity
          p2 asks for FRAGMENTED_MIB: <= free, > largest free (128 MiB): fragmentation

`python -m tests.standin.oom_scenario DEVDIR EXPECTED_JSON [--pre PID] [--release FILE]`
runs p1 and p2 as its children (traced when recorded as the command), writes what a
report must find to EXPECTED_JSON, then holds everything until FILE exists (the test
creates it once the recorder has written its incident samples) and exits.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.standin.standin import read_state

BUDGET_MIB = 1024
PRE_MIB = 256
P1_MIB = 128
P2_BLOCK_MIB = 64
P2_BLOCKS = 8
CAPACITY_MIB = 512
FRAGMENTED_MIB = 192
MIB = 1 << 20
NV_ERR_NO_MEMORY = 0x51
HOLD_TIMEOUT_S = 300.0


class Holder:
    """One oom_workload process: `alloc`/`free` answer its JSON reply."""

    def __init__(self, devdir: Path | str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.standin.oom_workload", str(devdir)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            cwd=Path(__file__).resolve().parents[2])  # fmt: skip
        first = self._reply()
        if not first.get("ready"):
            raise RuntimeError(f"oom_workload did not start: {first}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _reply(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("oom_workload exited")
        out: dict[str, Any] = json.loads(line)
        return out

    def send(self, *words: object) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(" ".join(map(str, words)) + "\n")
        self.proc.stdin.flush()
        return self._reply()

    def alloc(self, name: str, mib: int) -> dict[str, Any]:
        return self.send("alloc", name, mib)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.send_quit()
        self.proc.wait(timeout=30)

    def send_quit(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("quit\n")
        self.proc.stdin.close()


def pre_holder(devdir: Path | str) -> Holder:
    """The process started before the recording, holding PRE_MIB at offset 0."""
    h = Holder(devdir)
    r = h.alloc("pre", PRE_MIB)
    if r["status"] != 0 or r["offset"] != 0:
        raise RuntimeError(f"pre-existing holder: {r}")
    return h


def _heap(devdir: Path | str) -> dict[str, int]:
    """The stand-in's own log of GPU 0's heap now (its state file)."""
    gpu = read_state(devdir).gpus[0]
    return {"heap_free_bytes": int(gpu["heap_free"]),
            "largest_free_bytes": int(gpu["largest_free"])}


def run(devdir: Path | str, pre_pid: int | None) -> tuple[dict[str, Any], list[Holder]]:
    """Plant the scenario; (expected truth, the holders to close when done)."""
    p1, p2 = Holder(devdir), Holder(devdir)
    assert p1.alloc("a", P1_MIB) == {"status": 0, "offset": (PRE_MIB) * MIB}
    base = PRE_MIB + P1_MIB
    for i in range(P2_BLOCKS):
        r = p2.alloc(f"b{i}", P2_BLOCK_MIB)
        assert r == {"status": 0, "offset": (base + i * P2_BLOCK_MIB) * MIB}, r
    for i in range(0, P2_BLOCKS, 2):
        p2.send("free", f"b{i}")
    held = {"p1": P1_MIB * MIB, "p2": P2_BLOCKS // 2 * P2_BLOCK_MIB * MIB}
    free = BUDGET_MIB * MIB - PRE_MIB * MIB - held["p1"] - held["p2"]
    largest = (BUDGET_MIB - base - P2_BLOCKS * P2_BLOCK_MIB) * MIB
    planted = {"heap_free_bytes": free, "largest_free_bytes": largest}
    failures = []
    for who, h, mib, verdict in ((p1, "p1", CAPACITY_MIB, "capacity"),
                                 (p2, "p2", FRAGMENTED_MIB, "fragmentation")):
        before = _heap(devdir)
        if before != planted:
            raise RuntimeError(f"stand-in heap {before}, planted {planted}")
        t0 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        r = who.alloc("big", mib)
        t1 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        if r["status"] != NV_ERR_NO_MEMORY:
            raise RuntimeError(f"{h} {mib} MiB: {r}, expected NV_ERR_NO_MEMORY")
        failures.append({"process": h, "pid": who.pid, "requested_bytes": mib * MIB,
                         "verdict": verdict, "status": r["status"],
                         "call_start_ns": t0, "call_end_ns": t1, **before})
    truth = {
        "gpu_index": 0,
        "heap_size_bytes": BUDGET_MIB * MIB,
        "holders": {
            **({str(pre_pid): {"bytes": PRE_MIB * MIB, "traced": False, "role": "pre"}}
               if pre_pid is not None else {}),
            str(p1.pid): {"bytes": held["p1"], "traced": True, "role": "p1"},
            str(p2.pid): {"bytes": held["p2"], "traced": True, "role": "p2"},
        },
        "failures": failures,
    }
    return truth, [p1, p2]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("devdir")
    ap.add_argument("expected")
    ap.add_argument("--pre", type=int, default=None, help="pid of the pre-existing holder")
    ap.add_argument("--release", default=None, help="hold until this file exists")
    a = ap.parse_args(argv)
    truth, holders = run(a.devdir, a.pre)
    tmp = a.expected + ".tmp"
    Path(tmp).write_text(json.dumps(truth, indent=1))
    os.replace(tmp, a.expected)
    if a.release:
        deadline = time.monotonic() + HOLD_TIMEOUT_S
        while not os.path.exists(a.release) and time.monotonic() < deadline:
            time.sleep(0.02)
    for h in holders:
        h.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
