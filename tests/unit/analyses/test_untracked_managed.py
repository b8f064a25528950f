"""The "CPU faults are missing" warning counts managed blocks the in-kernel filter could
not watch, except when every UVM process had a tools tracker (its CPU faults then come
from the driver's own stream: the real H200 gpu_workload trace is that case)."""

from __future__ import annotations

import json
from pathlib import Path

from gputrace.analyses.helpers.inputs import _untracked_managed

ROOT = Path(__file__).resolve().parents[3]


def test_counts_untracked_blocks_without_the_driver_layer() -> None:
    assert _untracked_managed({"cpu_faults": {"untracked_blocks": 7, "untracked_ranges": 2}}) == 9


def test_none_missing_when_every_uvm_process_had_a_tracker() -> None:
    m = {"cpu_faults": {"untracked_blocks": 7},
         "driver_layer": {"cpu_fault_source": {"uvm_pids_without_tracker": []}}}
    assert _untracked_managed(m) == 0


def test_still_counted_when_a_uvm_process_had_no_tracker() -> None:
    m = {"cpu_faults": {"untracked_blocks": 7},
         "driver_layer": {"cpu_fault_source": {"uvm_pids_without_tracker": [42]}}}
    assert _untracked_managed(m) == 7


def test_real_h200_manifest_before_the_field_existed_keeps_warning() -> None:
    # Recorded at 50ed17d, before cpu_fault_source named untracked pids: no claim is made.
    m = json.loads((ROOT / "fixtures/real-h200-driver-cuda/trace/manifest.json").read_text())
    assert _untracked_managed(m) > 0
