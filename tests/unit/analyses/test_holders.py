"""Memory no live process owns (`analyze --only holders`), on a built trace whose truth
is written beside it (synthetic, gputrace.trace.builder):

- train (pid 100) opens the device files at 1 s, forks 4 workers (101-104) at 2 s and
  exits at 5 s; the workers hold its files to the end (20 s). The driver's accounting
  at 19.5 s still charges pid 100 1.2 GiB: its context, kept alive by the workers.
- old (pid 300) exits at 10 s; the driver still charges it 256 MiB and no traced
  process holds its files.
- pid 777 is charged 512 MiB and the trace never saw it (another PID namespace).
- serve (pid 200) opens its own files and is charged 1 GiB: alive and traced, no case.
- zed (pid 400): its main thread exits alone at 12 s, 2 threads run on (the recorder
  read them at the exit); the driver still charges it 64 MiB: a zombie.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gputrace.trace.builder import GiB, MiB, TraceBuilder
from tests.analyze_helpers import analyze

WORKERS = [101, 102, 103, 104]
TRAIN = 1288490188  # 1.2 GiB, as the driver charges it


def build(path: Path) -> Path:
    b = TraceBuilder(("syscall", "api", "rm_query"), duration_s=20.0)  # synthetic
    b.process(100, "train", start=0.5, exit=5.0)
    for w in WORKERS:
        b.process(w, "worker", start=2.0, ppid=100)
    b.process(200, "serve", start=0.5)
    b.process(300, "old", start=0.5, exit=10.0)
    b.process(400, "zed", start=0.5, exit=12.0, zombie_threads=2)
    b.open_fd(1.0, 400, fd=3)
    b.open_fd(1.0, 100, fd=3)
    b.open_fd(1.0, 100, fd=4, device_code=2)
    b.dup_fd(1.5, 100, fd=3, new_fd=9)
    b.open_fd(1.0, 200, fd=5)
    b.open_fd(1.0, 300, fd=3)
    b.close(9.0, 300, fd=3)
    for pid, vid in ((100, TRAIN), (200, GiB), (300, 256 * MiB), (777, 512 * MiB),
                     (400, 64 * MiB)):
        b.gpu_process_memory(19.5, 0, pid, vid)
    return b.build(path)


@pytest.fixture(scope="module")
def rep(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    doc: dict[str, Any] = analyze(build(tmp_path_factory.mktemp("h") / "t"), ["holders"])
    return doc["holders"]


def test_every_case_at_the_end_with_its_bytes(rep: dict[str, Any]) -> None:
    (end,) = rep["instants"]
    assert end["at"] == "end"
    got = {(c["case"], c["pid"]): (c["bytes"], c["holders"], c["orphaned"])
           for c in end["cases"]}
    assert got == {("inherited", 100): (TRAIN, WORKERS, True),
                   ("exited", 300): (256 * MiB, [], True),
                   ("unseen", 777): (512 * MiB, [], True),
                   ("zombie", 400): (64 * MiB, [], True)}
    assert end["orphaned_bytes"] == rep["orphaned_bytes"] == TRAIN + 832 * MiB


def test_holders_inherit_the_openers_three_fds(rep: dict[str, Any]) -> None:
    (end,) = rep["instants"]
    held = {h["pid"]: (h["fds"], h["opened_by"], h["inherited"]) for h in end["holders"]}
    assert held == {**{w: (3, [100], True) for w in WORKERS}, 200: (1, [200], False)}


def test_verdicts_in_plain_words(rep: dict[str, Any]) -> None:
    (end,) = rep["instants"]
    v = {c["case"]: c["verdict"] for c in end["cases"]}
    assert v["inherited"] == ("4 worker processes (pids 101, 102, 103, 104) forked from "
                              "train (pid 100) after it opened the GPU device files keep "
                              "its memory alive: 1.2 GiB; train exited 15 s ago")
    assert v["exited"].startswith("old (pid 300) exited 10 s ago and the driver still "
                                  "charges it 256.0 MiB")
    assert v["unseen"].startswith("pid 777: the driver charges it 512.0 MiB; the trace "
                                  "never saw it")
    assert v["zombie"] == ("zed (pid 400) is a zombie: its main thread exited 8 s ago while 2 "
                           "other threads ran on, keeping its device files; the driver still "
                           "charges it 64.0 MiB (`ps` shows it <defunct>; ending its threads "
                           "frees it)")


def test_a_child_that_closes_them_lets_go(tmp_path: Path) -> None:
    """The same, but each worker closes fds 3, 4 and 9 at 6 s: nobody holds train's
    files at the end, and the driver's 1.2 GiB for the dead pid is an `exited` case."""
    b = TraceBuilder(("syscall", "api", "rm_query"), duration_s=20.0)  # synthetic
    b.process(100, "train", start=0.5, exit=5.0)
    for w in WORKERS:
        b.process(w, "worker", start=2.0, ppid=100)
        for fd in (3, 4, 9):
            b.close(6.0, w, fd=fd)
    b.open_fd(1.0, 100, fd=3)
    b.open_fd(1.0, 100, fd=4)
    b.dup_fd(1.5, 100, fd=3, new_fd=9)
    b.gpu_process_memory(19.5, 0, 100, TRAIN)
    (end,) = analyze(b.build(tmp_path / "t"), ["holders"])["holders"]["instants"]
    assert end["holders"] == []
    assert [(c["case"], c["pid"], c["bytes"]) for c in end["cases"]] == [
        ("exited", 100, TRAIN)]
