"""The manifest's `trace_id` (a random UUID the recorder writes at start): validated like
every manifest field, and the identity `gputrace export` files a trace under, so two
recordings that agree on everything else stay two traces. Copies of a recorded fixture
with hand-edited ids."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from gputrace.fleet.export import trace_id
from tests.cli_helpers import cli
from tests.conftest import FIXTURES
from tests.unit.commands.test_errors import assert_one_line_error
from tests.unit.fleet.test_fleet_export import renamed


@pytest.mark.parametrize("bad", ["../escape", ".hidden", "a/b", "", "x" * 101, 7, ["id"]])
def test_a_bad_trace_id_is_one_line_naming_it(tmp_path: Path, bad: object) -> None:
    t = renamed(FIXTURES / "default", tmp_path / "t", "h", trace_id=bad)
    assert_one_line_error(cli("info", str(t)), "'trace_id'")
    assert_one_line_error(cli("export", str(t), "--to", str(tmp_path / "ds")), "'trace_id'")
    assert not (tmp_path / "ds" / "traces").exists()


def test_export_files_a_trace_under_its_manifest_id(tmp_path: Path) -> None:
    ids = [str(uuid.uuid4()), str(uuid.uuid4())]
    # the same recording copied twice, told apart only by the id the recorder gave each
    traces = [renamed(FIXTURES / "default", tmp_path / f"t{i}", "h", trace_id=tid)
              for i, tid in enumerate(ids)]  # fmt: skip
    r = cli("info", str(traces[0]))
    assert r.returncode == 0, r.stderr
    r = cli("export", *map(str, traces), "--to", str(tmp_path / "ds"))
    assert r.returncode == 0, r.stderr
    index = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert sorted(index["traces"]) == sorted(ids)
    for tid in ids:
        assert json.loads((tmp_path / "ds" / "traces" / f"{tid}.json").read_text())[
            "manifest"]["trace_id"] == tid
        assert list((tmp_path / "ds").glob(f"ioctls/date=*/host=h/{tid}.parquet"))
    # without ids the two copies are one recording (the hash of what never changes)
    m = json.loads((traces[0] / "manifest.json").read_text())
    del m["trace_id"]
    assert trace_id(m).startswith("t") and trace_id({**m, "trace_id": ids[1]}) == ids[1]
