"""Apply each named mutant of docs/testing.md to a scratch copy of the committed tree
and run the test named to kill it: prints KILLED or SURVIVED per mutant and exits 1
if any survived (or a site moved and the mutant no longer applies).

    python3 scripts/named_mutants.py            # the nine, without the live one
    python3 scripts/named_mutants.py --live     # also the BPF VID_HEAP swap (root, FUSE)

The working tree is never modified: the copy is `git archive HEAD` in a temp dir.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    old: str
    new: str
    test: str
    live: bool = False


MUTANTS = [
    Mutant("thrashing threshold > instead of >=", "gputrace/analyses/fault_rate/thrashing.py",
           'pl.col("reversals") >= min_reversals', 'pl.col("reversals") > min_reversals',
           "tests/scenarios/test_truth_planted.py::test_thrashing_at_exactly_the_threshold"),
    Mutant("SET_PREFERRED_LOCATION status offset wrong before 550.40.07",
           "gputrace/record/driver_version.py", "status=36 if _ge(v, 550, 40, 7) else 32",
           "status=36 if _ge(v, 550, 40, 7) else 36",
           "tests/unit/record/test_decode_fields.py::test_uvm_layouts_match_the_facts"),
    Mutant("GPU index 0 decoded as null (ioctls)", "gputrace/record/decode.py",
           '"gpu_index": _masked(gpu, gpu >= 0)', '"gpu_index": _masked(gpu, gpu > 0)',
           "tests/unit/record/test_decode_fields.py::test_ioctl_gpu_index_0_1_and_absent"),
    Mutant("RM_VID_HEAP_CONTROL allocs and frees swapped (analysis)",
           "gputrace/analyses/helpers/rm_objects.py",
           'heap_alloc = (pl.col("name") == VID_HEAP) & (pl.col("size_bytes").fill_null(0) > 0)',
           'heap_alloc = (pl.col("name") == VID_HEAP) & (pl.col("size_bytes").fill_null(0) == 0)',
           "tests/scenarios/test_truth_planted.py::test_vid_heap_control_allocs_and_frees"),
    Mutant("RM_VID_HEAP_CONTROL allocs and frees swapped (probe)", "probes/nv_rm.bpf.h",
           "if (fn == 2) {", "if (fn == 3) {",
           "tests/live/test_record_vidheap.py::test_vid_heap_alloc_and_free_rows", live=True),
    Mutant("RM handles keyed without their client", "gputrace/analyses/helpers/rm_objects.py",
           'KEY = ["pid", "client", "handle"]', 'KEY = ["pid", "handle"]',
           "tests/scenarios/test_truth_planted.py::test_rm_handles_are_keyed_with_their_client"),
    Mutant("parent-object free guard loosened", "gputrace/analyses/helpers/rm_objects.py",
           'pend = pl.when(pend >= pl.col("ts_ns")).then(pend)',
           'pend = pl.when(pend.is_not_null()).then(pend)',
           "tests/scenarios/test_truth_planted.py::test_parent_freed_before_child_existed_does_not_end_it"),
    Mutant("drops warning switched off in info", "gputrace/commands/info.py",
           "if sum(drops.values()):", "if False and sum(drops.values()):",
           "tests/scenarios/test_mutants_named.py::test_info_warns_about_drops"),
    Mutant("lost events counted from one ring buffer only (recorder)",
           "gputrace/record/loader.py", "for i, name in enumerate(BUFFERS)",
           "for i, name in enumerate(BUFFERS[:1])",
           "tests/scenarios/test_mutants_named.py::test_probe_drops_counted_from_every_ring_buffer"),
    Mutant("lost events counted from one ring buffer only (reports)",
           "gputrace/analyses/helpers/inputs.py", "lost = sum(inp.drops.values())",
           'lost = inp.drops.get("ioctl_events", 0)',
           "tests/scenarios/test_mutants_named.py::test_reports_sum_lost_events_over_every_buffer"),
    Mutant("exit-time free boundary moved by one", "gputrace/analyses/allocations/rows.py",
           "(free >= exit_)", "(free >= exit_ + 1)",
           "tests/scenarios/test_truth_planted.py::test_free_at_the_exit_nanosecond_is_teardown"),
]


def _run_test(tree: Path, test: str) -> int:
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("GPUTRACE_LIVE_REPORT", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                           test], cwd=tree, env=env, capture_output=True, text=True,
                          timeout=900).returncode


def main(argv: list[str]) -> int:
    live = "--live" in argv
    chosen = [m for m in MUTANTS if live or not m.live]
    bad = 0
    with tempfile.TemporaryDirectory(prefix="gputrace-mutants-") as tmp:
        tree = Path(tmp)
        archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        # the stand-ins' build outputs are not committed; reuse this checkout's
        for b in ("tests/standin/build", "tests/standin_cuda/build"):
            if (ROOT / b).is_dir():
                subprocess.run(["cp", "-a", str(ROOT / b), str(tree / b)], check=True)
        for m in chosen:
            if _run_test(tree, m.test) != 0:
                print(f"BASELINE FAILS  {m.test}")
                bad += 1
                continue
            f = tree / m.path
            text = f.read_text()
            if text.count(m.old) != 1:
                print(f"NOT APPLIED     {m.name}: {m.old!r} not found once in {m.path}")
                bad += 1
                continue
            f.write_text(text.replace(m.old, m.new))
            try:
                rc = _run_test(tree, m.test)
            finally:
                f.write_text(text)
            verdict = "KILLED " if rc != 0 else "SURVIVED"
            bad += rc == 0
            print(f"{verdict}        {m.name}  <-  {m.test}")
    print(f"named mutants: {len(chosen) - bad} killed of {len(chosen)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
