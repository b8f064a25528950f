"""`gputrace info` wording: the target line, and whether managed ranges the in-kernel
CPU-fault filter could not hold mean missing CPU faults (manifests are synthetic)."""

from __future__ import annotations

from gputrace.commands.info import _target, _unknown_why, _untracked_lines
from gputrace.trace.reader import open_trace
from tests.conftest import FIXTURES


def test_target_line_names_each_mode_once() -> None:
    assert _target({"mode": "pids", "pids": [1496, 1497]}) == "pids 1496,1497"
    assert _target({"mode": "command", "command": ["sleep", "1"], "pids": [7]}) == \
        "command sleep 1 (pid 7)"
    assert _target({"mode": "host"}) == "whole host"
    assert _target({}) == "?"


def test_untracked_ranges_are_no_loss_when_every_uvm_process_had_a_tracker() -> None:
    cpu = {"untracked_blocks": 5, "untracked_ranges": 1}
    dl = {"attach_failures": [], "cpu_fault_source": {"uvm_tools_pids": [10]}}
    (line,) = _untracked_lines(cpu, dl)
    assert line.startswith("note: ") and "no CPU faults are missing" in line
    dl["cpu_fault_source"]["uvm_pids_without_tracker"] = [11]  # type: ignore[index]
    (line,) = _untracked_lines(cpu, dl)
    assert line.startswith("warning: ") and "(pids 11)" in line and "(pids 10)" in line
    (line,) = _untracked_lines(cpu, None)
    assert line == ("warning: managed ranges too large for the in-kernel filter: 5 blocks, "
                    "1 ranges untracked (their CPU faults are missing)")
    assert _untracked_lines({"untracked_blocks": 0, "untracked_ranges": 0}, dl) == []


def test_real_h200_untracked_blocks_are_covered_by_the_tracker() -> None:
    """gpu_workload on the H200: 1,047,548 managed blocks beyond the filter, one tracked
    process: the old text called its CPU faults missing; they are in the trace."""
    m = open_trace(FIXTURES / "real-h200-driver-cuda" / "trace").manifest
    (line,) = _untracked_lines(m["cpu_faults"], m["driver_layer"])
    assert line.startswith("note: ") and "1047548 blocks" in line


def test_unknown_python_frames_say_why() -> None:
    """How many Python frames are unknown and why (the recorder's reasons, counted);
    a trace from before the reasons were kept gives the one reason there was then."""
    py = {"frames": 12, "unknown_frames": 3,
          "unknown_reasons": {"exited before its stack was read": 2, "not a code object": 1}}
    assert _unknown_why(py) == (" (2: exited before its stack was read; "
                                "1: not a code object)")
    assert _unknown_why({"frames": 4, "unknown_frames": 4}) == " (the process exited first)"
    assert _unknown_why({"frames": 4, "unknown_frames": 0, "unknown_reasons": {}}) == ""
