"""Columns beside this tree's recorder, so that a benchmark puts them side by
side in one run (same load, same machine state): another revision's recorder,
and the dispatch floor (floor.py's null programs on the same hook points).
`git archive REV` is unpacked into a scratch folder and `gputrace record` runs
from it (`python -P`: the repository root, the current folder of the recorder
process, is then not on its import path)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

from tests.record_helpers import RecorderProc  # noqa: E402

T = TypeVar("T")


def checkout(rev: str, into: Path) -> Path:
    """The tree of `rev` (a commit, tag or branch) unpacked into `into`."""
    into.mkdir(parents=True, exist_ok=True)
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "gputrace", "probes"],
                         check=True, capture_output=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(into)], input=tar, check=True)
    return into


def tree_of(spec: str, into: Path) -> Path | None:
    """The recorder tree a benchmark column runs: '' for this working tree, a
    directory holding gputrace/ and probes/ as it is, else a revision (checkout)."""
    if not spec:
        return None
    if (Path(spec) / "gputrace").is_dir():
        return Path(spec).resolve()
    return checkout(spec, into)


def start_recorder_from(tree: Path | None, out: Path, *args: str) -> RecorderProc:
    """`gputrace record -o out --force ARGS` from `tree` (None: this tree),
    returned once every probe is attached."""
    argv = [sys.executable, "-P", "-m", "gputrace.cli", "record", "-o", str(out), "--force", *args]
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(tree or ROOT)
    try:
        rec = RecorderProc(argv)
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old
    rec.wait_ready()
    return rec


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def other_tracers() -> int:
    """`gputrace record` and floor.py processes on this host that this benchmark
    did not start: their probes run in every process, so a column measured while
    one runs is not comparable (a shared machine: printed, not prevented)."""
    me, n = os.getpid(), 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not (b"gputrace.cli" in argv and b"record" in argv) and not any(
            a.endswith(b"untraced/floor.py") for a in argv
        ):
            continue
        pid = int(d.name)
        while pid > 1 and pid != me:
            pid = _ppid(pid)
        n += pid != me
    return n


def bpf_stats() -> str:
    """kernel.bpf_stats_enabled: when 1 every BPF program run also reads the clock
    twice, which inflates each hook's cost (tp_btf's most: it runs on every syscall)."""
    try:
        return Path("/proc/sys/kernel/bpf_stats_enabled").read_text().strip()
    except OSError:
        return "?"


def under_floor(mech: str, work: Callable[[], T]) -> T:
    """Run `work` while floor.py holds null programs on the hook points of `mech`."""
    script = Path(__file__).resolve().parent / "floor.py"
    p = subprocess.Popen([sys.executable, str(script), mech], text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
    assert p.stdout is not None and p.stdin is not None
    if p.stdout.readline().strip() != "ready":
        raise RuntimeError(f"floor.py {mech} did not attach")
    try:
        return work()
    finally:
        p.stdin.close()
        p.wait(60)
