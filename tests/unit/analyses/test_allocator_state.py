"""The allocator's state over time and its segment maps (timeseries/allocator_state.py),
on snapshots built beside the test (tests/cpp_snapshot.py): nine tensors of 1..9 MiB,
each in its own segment, allocated 1 ms apart; then an allocation of 4 GiB fails and
the 9 MiB tensor is freed. Its truth: reserved and active bytes climb by each tensor's
size and end at 45 and 36 MiB; at the failure the 9 MiB segment is full, at the end it
is free."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gputrace.analyses.helpers.inputs import inputs_from_trace
from gputrace.analyses.timeseries.allocator_state import allocator_state
from gputrace.cli import main
from gputrace.importers.torch_snapshot import read_snapshot, write_alone
from gputrace.trace.reader import open_trace
from tests import cpp_snapshot

MiB = 1 << 20


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("oom")
    snap = cpp_snapshot.write(tmp / "s.pickle", oom_then_free=cpp_snapshot.SITES[-1])
    return write_alone(read_snapshot(snap), tmp / "t")


def test_replayed_backwards_from_the_snapshot(trace: Path) -> None:
    a = allocator_state(inputs_from_trace(open_trace(trace)), buckets=1000)
    assert a["devices"] == [0]
    (s,) = a["series"]
    assert (s["end_reserved_bytes"], s["end_active_bytes"]) == (45 * MiB, 36 * MiB)
    assert s["reserved"][-1] == 45 * MiB and s["active"][-1] == 36 * MiB
    # the history starts from nothing: the first tensor's segment, then the first tensor
    seen = [v for v in s["active"] if v is not None]
    assert seen[0] in (0, 1 * MiB) and max(seen) == 45 * MiB
    assert len(s["oom_t_s"]) == 1 and 0 < s["oom_t_s"][0] <= s["t_s"][-1]


def test_segment_map_at_the_end_and_at_the_failure(trace: Path) -> None:
    a = allocator_state(inputs_from_trace(open_trace(trace)))
    end, oom = a["maps"]
    assert end.get("oom_t_s") is None and oom["oom_t_s"] is not None
    assert oom["requested_bytes"] == cpp_snapshot.OOM_MIB * MiB
    # largest first: the 9 MiB segment, free at the end, full at the failure
    assert end["segments"][0]["pieces"] == [{"offset": 0, "bytes": 9 * MiB, "kind": "free"}]
    assert oom["segments"][0]["pieces"] == [
        {"offset": 0, "bytes": 9 * MiB, "kind": "allocated"}]
    for m in (end, oom):
        assert [x["total_bytes"] for x in m["segments"]] == [
            (9 - i) * MiB for i in range(9)]
        for x in m["segments"]:
            assert sum(p["bytes"] for p in x["pieces"]) == x["total_bytes"]


def test_html_draws_both_maps(trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    assert main(["analyze", str(trace), "-f", "html", "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert "<h2>Segment map, device 0</h2>" in page
    assert "Segment map, device 0 at the out-of-memory at" in page
    assert "asked for 4.0 GiB" in page and '"name":"out of memory"' in page


def test_pools_add_up_to_the_device_on_the_real_snapshot(tmp_path: Path) -> None:
    """The real H200 snapshot (fixtures/real-h200-torch): its large and small pools,
    replayed apart, add up to the device's reserved and allocated bytes at every bucket,
    and end at the pool report's figures (281,018,368 + 2,097,152 reserved)."""
    from tests.conftest import ROOT

    real = ROOT / "fixtures" / "real-h200-torch" / "torch-workload.snapshot.pickle.xz"
    a = allocator_state(inputs_from_trace(open_trace(
        write_alone(read_snapshot(real), tmp_path / "t"))), buckets=50)
    (s,) = a["series"]
    pools = {p["pool"]: p for p in s["pools"]}
    assert set(pools) == {"large", "small"}
    assert (pools["large"]["reserved"][-1], pools["small"]["reserved"][-1]) == (
        281_018_368, 2_097_152)
    for k in ("reserved", "active"):
        for i, total in enumerate(s[k]):
            parts = [p[k][i] for p in pools.values() if p[k][i] is not None]
            assert total == sum(parts), (k, i)


def _state(name: str, tmp_path: Path, buckets: int = 50) -> dict[str, Any]:
    from tests.conftest import ROOT

    snap = next((ROOT / "fixtures" / name).glob("*.pickle*"))
    return allocator_state(inputs_from_trace(open_trace(
        write_alone(read_snapshot(snap), tmp_path / name))), buckets=buckets)


def test_expandable_map_at_the_failure(tmp_path: Path) -> None:
    """fixtures/torch-expandable, device 0 (SYNTHETIC): at the 48 MiB failure its one
    expandable segment has 32 MiB mapped (the other 32 unmapped just before), a 20 MiB
    block live at its start and 12 MiB free after it; at the end 64 MiB are mapped.
    By hand from the fixture's entries (make_torch_snapshots.py `expandable`)."""
    a = _state("torch-expandable", tmp_path)
    (oom,) = [m for m in a["maps"] if m.get("oom_t_s") is not None]
    assert (oom["device"], oom["requested_bytes"]) == (0, 48 * MiB)
    (seg,) = oom["segments"]
    assert (seg["total_bytes"], seg["pool"]) == (32 * MiB, "large")
    assert seg["pieces"] == [{"offset": 0, "bytes": 20 * MiB, "kind": "allocated"},
                             {"offset": 20 * MiB, "bytes": 12 * MiB, "kind": "free"}]
    s0 = a["series"][0]
    assert s0["reserved"][-1] == 64 * MiB and 32 * MiB in s0["reserved"]


@pytest.mark.parametrize("name", ["torch-current", "torch-expandable"])
def test_pools_add_up_and_end_at_the_pool_report(name: str, tmp_path: Path) -> None:
    """Every device: its pools (private ones and entries of freed segments apart) add up
    to its reserved and active lines at every bucket, null where it is null; each ends
    at the snapshot's own figures, summed here from the raw segments' blocks."""
    from tests.unit.importers.test_torch_formats import FILES, raw

    a = _state(name, tmp_path)
    want: dict[int, list[int]] = {}
    for seg in raw(FILES[name])["segments"]:
        w = want.setdefault(seg["device"], [0, 0])
        w[0] += seg["total_size"]
        w[1] += sum(b["size"] for b in seg["blocks"] if b["state"] != "inactive")
    for s in a["series"]:
        assert [s["end_reserved_bytes"], s["end_active_bytes"]] == want[s["device"]]
        assert [s["reserved"][-1], s["active"][-1]] == want[s["device"]]
        for k in ("reserved", "active"):
            for i, total in enumerate(s[k]):
                parts = [p[k][i] for p in s.get("pools") or []]
                if total is None:
                    assert set(parts) <= {None}, (s["device"], k, i)
                elif parts:
                    assert total == sum(parts), (s["device"], k, i)
