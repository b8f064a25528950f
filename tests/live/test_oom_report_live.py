"""Live: the oom report of a real recording on the FUSE stand-in
(tests/standin/oom_scenario.py, its truth written by the scenario itself): three
holders on one GPU, one started before the recording; a capacity failure and, after
planted fragmentation, a fragmentation failure. The report names each verdict, the
requesting process, the requested bytes, the free and largest free memory the
stand-in logged at that instant, and every holder's bytes by the driver's accounting
and by the recorded RM layer, the untraced holder marked not traced. Recorded as a
flight recorder (`--keep 1m --freeze-on oom`), the same recording's incident trace
gives the same incident as the whole trace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.analyze_helpers import analyze
from tests.record_helpers import live_skip_reason
from tests.standin.oom_record import record_oom_scenario

pytestmark = [pytest.mark.live]
_SKIP = live_skip_reason()
if _SKIP is not None:
    pytestmark.append(pytest.mark.skip(reason=_SKIP))


def _same(inc: dict[str, Any]) -> dict[str, Any]:
    """An incident without what depends on where its trace starts (its time from the
    start, and who held device files: an incident trace lacks the opens before it)."""
    return {k: v for k, v in inc.items() if k not in ("t_s", "no_live_owner")}


def test_oom_report_names_verdicts_and_every_holder(tmp_path: Path) -> None:
    out, truth = record_oom_scenario(tmp_path, ("--keep", "1m", "--freeze-on", "oom",
                                                "--after", "1s"))
    rep = analyze(out, ["oom"])["oom"]
    failures = truth["failures"]
    assert rep["count"] == len(failures) == 2 and rep["failures"] == 2
    holders = {int(k): v for k, v in truth["holders"].items()}
    for inc, f in zip(rep["incidents"], failures, strict=True):
        assert (inc["verdict"], inc["pid"], inc["requested_bytes"], inc["layer"],
                inc["call"], inc["status"], inc["gpu_index"]) == (
            f["verdict"], f["pid"], f["requested_bytes"], "rm", "RM_ALLOC", f["status"],
            truth["gpu_index"])
        assert f["call_start_ns"] <= inc["ts_ns"] <= f["call_end_ns"]
        g = inc["gpu"]
        assert (g["total_bytes"], g["free_bytes"], g["largest_free_bytes"]) == (
            truth["heap_size_bytes"], f["heap_free_bytes"], f["largest_free_bytes"])
        assert g["sample_trigger"] == "incident"
        got = {h["pid"]: h for h in inc["holders"]}
        assert set(got) == set(holders)
        for pid, want in holders.items():
            h = got[pid]
            assert (h["driver_bytes"], h["traced"]) == (want["bytes"], want["traced"]), pid
            # the recorded RM layer holds exactly what the driver accounts (the
            # pre-existing holder has no recorded events: no recorded bytes)
            assert h["rm_bytes"] == (want["bytes"] if want["traced"] else None), pid
    # the flight recorder's incident trace(s): the same incident, alone
    m = json.loads((out / "manifest.json").read_text())
    assert m["incidents"] and {i["status"] for i in m["incidents"]} == {"kept"}
    full = {i["ts_ns"]: _same(i) for i in rep["incidents"]}
    seen = 0
    for kept in m["incidents"]:
        for inc in analyze(out / kept["dir"], ["oom"])["oom"]["incidents"]:
            assert _same(inc) == full[inc["ts_ns"]]
            seen += 1
    assert seen >= 1
