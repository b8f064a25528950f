"""A manifest with a field of the wrong type is one line naming the field, exit 1.

Each case edits one field of a copy of a recorded fixture's manifest (the
values are hand-made damage, the trace itself was recorded) and runs
`gputrace info` in-process through `gputrace.cli.main`, so a traceback would
escape the test instead of hiding in a subprocess.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from gputrace.cli import main
from gputrace.trace.manifest import MAX_BYTES, MAX_DEPTH
from tests.conftest import FIXTURES

RECORDED = FIXTURES / "standin-cuda"

# (manifest key, wrong value, text the one-line error must contain)
MUTATIONS: list[tuple[str, Any, str]] = [
    ("drops", [], "'drops'"),
    ("drops", "none", "'drops'"),
    ("drops", 5, "'drops'"),
    ("drops", None, "'drops'"),
    ("drops", {"ioctl_events": "3"}, "'drops.ioctl_events'"),
    ("drops", {"ioctl_events": -1}, "'drops.ioctl_events'"),
    ("drops", {"ioctl_events": 1.5}, "'drops.ioctl_events'"),
    ("drops", {"ioctl_events": True}, "'drops.ioctl_events'"),
    ("gpus", "nvidia0", "'gpus'"),
    ("gpus", {"0": {}}, "'gpus'"),
    ("gpus", [5], "'gpus[0]'"),
    ("gpus", [{"index": "0"}], "'gpus[0].index'"),
    ("gpus", [{"path": "/dev/nvidia0"}], "'gpus[0].index'"),
    ("gpus", [{"index": 0, "memory_bytes": "80GB"}], "'gpus[0].memory_bytes'"),
    ("hooks", 7, "'hooks'"),
    ("hooks", [], "'hooks'"),
    ("hooks", {"attached": "all"}, "'hooks.attached'"),
    ("hooks", {"skipped": [{"name": 3}]}, "'hooks.skipped[0].name'"),
    ("hooks", {"skipped": ["uprobe:x"]}, "'hooks.skipped[0]'"),
    ("hooks", {"notes": ["x"]}, "'hooks.notes'"),
    ("layers", None, "'layers'"),
    ("layers", "syscall", "'layers'"),
    ("layers", [1], "'layers[0]'"),
    ("status", 1, "'status'"),
    ("status", None, "'status'"),
    ("tables", [], "'tables'"),
    ("tables", {"ioctls": 87}, "'tables.ioctls'"),
    ("tables", {"ioctls": {"rows": "87", "parts": 1}}, "'tables.ioctls.rows'"),
    ("tables", {"ioctls": {"rows": 87}}, "'tables.ioctls.parts'"),
    ("start_ts_ns", "6720490764361", "'start_ts_ns'"),
    ("start_ts_ns", 1.5, "'start_ts_ns'"),
    ("end_ts_ns", -5, "'end_ts_ns'"),
    ("end_ts_ns", True, "'end_ts_ns'"),
    ("end_ts_ns", 1, "'end_ts_ns'"),  # before start_ts_ns
    ("host", "vm", "'host'"),
    ("host", None, "'host'"),
    ("host", {"hostname": 1}, "'host.hostname'"),
    ("target", [], "'target'"),
    ("target", {"command": "ls -l"}, "'target.command'"),
    ("target", {"pids": ["1"]}, "'target.pids[0]'"),
    ("clock", None, "'clock'"),
    ("clock", {"realtime_offset_ns": "0"}, "'clock.realtime_offset_ns'"),
    ("api", [], "'api'"),
    ("api", {"libraries": "libcuda.so"}, "'api.libraries'"),
    ("api", {"stack_frames": "39"}, "'api.stack_frames'"),
    ("cpu_faults", 3, "'cpu_faults'"),
    ("cpu_faults", {"untracked_blocks": "0"}, "'cpu_faults.untracked_blocks'"),
    ("synthetic", "yes", "'synthetic'"),
    ("driver_version", 580, "'driver_version'"),
    ("driver", "580.142", "'driver'"),
    ("schema_version", "1", "'schema_version'"),
    ("created_unix_s", "now", "'created_unix_s'"),
    ("gputrace_version", 1, "'gputrace_version'"),
    ("recorder", {"argv": "gputrace record"}, "'recorder.argv'"),
    ("device_dir", [], "'device_dir'"),
    ("decode_errors", {"ioctl_events": "2"}, "'decode_errors.ioctl_events'"),
    ("target_exit", {"status": "exited", "code": "0"}, "'target_exit.code'"),
    ("target_exit", 0, "'target_exit'"),
    ("format_version", "1", "format_version"),
    ("format_version", None, "format_version"),
    ("format", "something-else", "not a gputrace manifest"),
]


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    dst = tmp_path / "trace"
    shutil.copytree(RECORDED, dst)
    return dst


def run_info(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = main(["info", str(path)])
    return rc, capsys.readouterr().err


def assert_one_line(rc: int, err: str, needle: str) -> None:
    assert rc == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("gputrace: error: "), err
    assert needle in lines[0], err
    assert "Traceback" not in err


def edit(trace: Path, **fields: Any) -> None:
    path = trace / "manifest.json"
    m = json.loads(path.read_text())
    m.update(fields)
    path.write_text(json.dumps(m))


def test_enough_mutations() -> None:
    assert len(MUTATIONS) >= 30
    assert len({k for k, _, _ in MUTATIONS}) >= 20


def test_unmodified_copy_reads(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The baseline: without the damage, the same copy is fine (the cases can fail)."""
    rc, err = run_info(trace, capsys)
    assert rc == 0, err
    assert err == ""


@pytest.mark.parametrize(("key", "value", "needle"), MUTATIONS,
                         ids=[f"{k}={json.dumps(v)}" for k, v, _ in MUTATIONS])
def test_wrong_field_is_one_line_naming_it(
    trace: Path, capsys: pytest.CaptureFixture[str], key: str, value: Any, needle: str
) -> None:
    edit(trace, **{key: value})
    rc, err = run_info(trace, capsys)
    assert_one_line(rc, err, needle)


def test_missing_required_field(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m = json.loads((trace / "manifest.json").read_text())
    del m["format_version"]
    (trace / "manifest.json").write_text(json.dumps(m))
    assert_one_line(*run_info(trace, capsys), "format_version")


def test_control_characters_in_a_key_are_escaped(
    trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edit(trace, drops={"\x1b]0;owned\x07": "x"})
    rc, err = run_info(trace, capsys)
    assert_one_line(rc, err, "drops.")
    assert "\x1b" not in err and "\x07" not in err


def test_deeply_nested_json(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Deep enough to exhaust the JSON parser's recursion (RecursionError)."""
    text = (trace / "manifest.json").read_text().rstrip().rstrip("}")
    depth = 200_000
    (trace / "manifest.json").write_text(text + ', "x": ' + "[" * depth + "]" * depth + "}")
    assert_one_line(*run_info(trace, capsys), "nested too deeply")


def test_nesting_deeper_than_any_manifest(
    trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Parses, but deeper than the depth bound: refused before anything walks it."""
    deep: Any = 1
    for _ in range(MAX_DEPTH + 5):
        deep = {"k": deep}
    edit(trace, extra=deep)
    assert_one_line(*run_info(trace, capsys), "'extra.k.k")


def test_huge_manifest(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edit(trace, padding="x" * (MAX_BYTES + 10))
    assert_one_line(*run_info(trace, capsys), "more than a gputrace manifest can be")


@pytest.mark.parametrize("text", ["[]", "null", "3", '"gputrace-trace"'])
def test_manifest_not_an_object(
    trace: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    (trace / "manifest.json").write_text(text)
    assert_one_line(*run_info(trace, capsys), "not a gputrace manifest")


def test_unknown_fields_are_kept(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A newer recorder may add fields: they are not errors."""
    edit(trace, exit={"code": 3, "signal": None}, new_section=[{"a": 1}])
    rc, err = run_info(trace, capsys)
    assert rc == 0, err


def test_every_committed_trace_validates() -> None:
    from gputrace.trace.reader import open_trace

    manifests = sorted(FIXTURES.glob("**/manifest.json"))
    assert len(manifests) >= 4
    for m in manifests:
        open_trace(m.parent)
