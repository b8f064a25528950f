"""Tensors' Python frames when the program ends right after its last tensor, with no
waiting protocol (tests/standin_torch/torch_endings.py): returning, an uncaught
exception, os._exit, os.abort() (SIGABRT) and an out-of-memory failure then exit.
The torch_allocator layer stops a process at a malloc whose Python stack is new, as
the API layer stops its calls (cuda_stop_for; record/api/py_pauses.py reads the code
objects and continues it): each tensor's frames are named with function, file and
line exactly. One `gputrace record -- sh -c ...` runs every ending under every
CPython on the machine (root, bcc)."""

from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import dataclass
from typing import Any

import polars as pl
import pytest

from gputrace.trace.reader import open_trace
from tests.record_helpers import INTERPRETERS, ROOT, RUN_S, live_skip_reason, record_cmd

pytestmark = [pytest.mark.live, pytest.mark.xdist_group("torch_endings")]
_SKIP = live_skip_reason()
if _SKIP is not None:
    pytestmark.append(pytest.mark.skip(reason=_SKIP))

PROGRAM = ROOT / "tests" / "standin_torch" / "torch_endings.py"
ENDINGS = ("normal", "exception", "os_exit", "abort", "oom")
STATUS = {"normal": "0", "exception": "1", "os_exit": "0", "abort": str(128 + 6), "oom": "2"}
KIB, MIB = 1 << 10, 1 << 20
STEPS, TENSOR, LAST, OOM_BYTES = 3, 96 * KIB, 5 * MIB, 96 * MIB  # torch_endings.py's
CAP = "64M"  # the stand-in libcuda's largest allocation for `oom`: below OOM_BYTES


def _line(marker: str) -> int:
    lines = PROGRAM.read_text().splitlines()
    return next(i for i, x in enumerate(lines, 1) if x.endswith(f"# PLANT: {marker}"))


def _calls_line(callee: str, caller_def: str) -> int:
    """The line in `def caller_def` whose statement starts with `callee(`."""
    lines = PROGRAM.read_text().splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith(f"def {caller_def}("))
    return next(i for i, x in enumerate(lines[start:], start + 1)
                if x.strip().startswith(f"{callee}("))


@dataclass
class Endings:
    trace: Any
    pids: dict[tuple[str, str], int]  # (interpreter, ending) -> pid
    said: dict[tuple[str, str], list[list[str]]]  # the program's T/OOM lines
    stdout: str


@pytest.fixture(scope="module")
def endings(tmp_path_factory: pytest.TempPathFactory) -> Endings:
    from tests.standin_torch.standin_torch import StandinTorchUnavailable, build

    try:
        lib = str(build())
    except StandinTorchUnavailable as e:
        pytest.skip(str(e))
    tmp = tmp_path_factory.mktemp("torch-endings")
    logs = tmp / "logs"
    logs.mkdir()
    runs = [(n, e) for n, exe in INTERPRETERS.items() if exe.exists() for e in ENDINGS]
    lines = []
    for name, ending in runs:
        argv = " ".join(shlex.quote(str(a)) for a in
                        (INTERPRETERS[name], PROGRAM, lib, ending, logs / f"{name}-{ending}"))
        cap = f"GPUTRACE_STANDIN_CUDA_MAX={CAP} " if ending == "oom" else ""
        lines += [f"{cap}{argv} 2>/dev/null", f"echo {name} {ending} $?"]
    env = {k: v for k, v in os.environ.items() if k != "GPUTRACE_STANDIN_DEVDIR"}
    out = tmp / "trace"
    r = subprocess.run(record_cmd(out, "--", "sh", "-c", "\n".join(lines)), cwd=ROOT,
                       capture_output=True, text=True, timeout=RUN_S + 60, env=env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    pids, said = {}, {}
    for name, ending in runs:
        head, *rest = (logs / f"{name}-{ending}").read_text().splitlines()
        pid, word = head.split()
        assert word == ending
        pids[(name, ending)] = int(pid)
        said[(name, ending)] = [x.split() for x in rest]
    return Endings(open_trace(out), pids, said, r.stdout)


def test_every_ending_ended_as_planted(endings: Endings) -> None:
    """The programs really ended each way, right after their last tensor."""
    status = {tuple(ln.split()[:2]): ln.split()[2] for ln in endings.stdout.splitlines()
              if len(ln.split()) == 3}
    for name, ending in endings.pids:
        assert status[(name, ending)] == STATUS[ending], (name, ending)
        want = [["T", "*", str(TENSOR), "layer"]] * STEPS + [
            ["OOM", str(OOM_BYTES)] if ending == "oom" else ["T", "*", str(LAST), "last"]]
        got = [[w if i != 1 or x[0] != "T" else "*" for i, w in enumerate(x)]
               for x in endings.said[(name, ending)]]
        assert got == want, (name, ending)
    t = endings.trace
    assert t.status == "complete" and sum(t.drops.values()) == 0
    assert t.manifest["torch_allocator"]["skipped"] == []
    assert t.manifest["api"]["python"]["unknown_frames"] == 0


def _frames(t: Any, sid: int) -> list[tuple[str, str, int]]:
    fr = t.scan("allocator_frames").filter(pl.col("stack_id") == sid).collect().sort("depth")
    return [tuple(r) for r in fr.select("function", "filename", "line").rows()]


@pytest.mark.parametrize("ending", ENDINGS)
@pytest.mark.parametrize("name", list(INTERPRETERS))
def test_tensors_named_however_the_program_ends(endings: Endings, name: str,
                                                ending: str) -> None:
    if (name, ending) not in endings.pids:
        pytest.skip(f"{INTERPRETERS[name]} not installed")
    t, pid = endings.trace, endings.pids[(name, ending)]
    ev = t.scan("allocator_events").filter(pl.col("pid") == pid).collect().sort("seq")
    allocs = ev.filter(pl.col("action") == "alloc")
    tensors = [(int(x[1]), int(x[2])) for x in endings.said[(name, ending)] if x[0] == "T"]
    assert allocs.select("address", "size_bytes").rows() == [
        (p, max(512, (n + 511) // 512 * 512)) for p, n in tensors]
    f = str(PROGRAM)
    outer = [("main", f, _calls_line("forward", "main")),
             ("<module>", f, _module_line())]
    layer = [("layer", f, _line("layer")), ("forward", f, _calls_line("layer", "forward")),
             *outer]
    for sid in allocs["stack_id"].to_list()[:STEPS]:
        assert _frames(t, sid) == layer
    tail = [("main", f, _calls_line("last", "main")), outer[1]]
    if ending == "oom":
        oom = ev.filter(pl.col("action") == "oom")
        assert oom["size_bytes"].to_list() == [OOM_BYTES]
        assert _frames(t, oom["stack_id"][0]) == [("last", f, _line("oom")), *tail]
    else:
        assert _frames(t, allocs["stack_id"][STEPS]) == [("last", f, _line("last")), *tail]


def _module_line() -> int:
    lines = PROGRAM.read_text().splitlines()
    return next(i for i, x in enumerate(lines, 1) if x.strip() == "main(sys.argv)")
