"""`info` and `dump` on the bundled default trace, whose story is in
fixtures/make_default.py (10 iterations, 32 ioctls, 32 CUDA calls, ...)."""

from __future__ import annotations

import csv
import io
import json

from tests.cli_helpers import cli
from tests.conftest import FIXTURES

DEFAULT = str(FIXTURES / "default")


def test_info_text_names_layers_rows_and_synthetic() -> None:
    r = cli("info", DEFAULT)
    assert r.returncode == 0, r.stderr
    assert "status     complete" in r.stdout
    assert "layers     syscall, api, driver" in r.stdout
    assert "synthetic trace" in r.stdout
    rows = dict(
        line.split() for line in r.stdout.splitlines() if line.startswith("  ") and
        line.split()[0] in {"ioctls", "cuda_calls", "faults"}
    )
    # 10 iterations x 3 RM calls (2 allocs, 1 free) + 1 failed + 1 by preprocess = 32.
    assert rows == {"ioctls": "32", "cuda_calls": "32", "faults": "14"}


def test_info_json() -> None:
    r = cli("info", DEFAULT, "--json")
    info = json.loads(r.stdout)
    assert info["rows"]["processes"] == 2
    assert info["status"] == "complete"
    assert info["duration_s"] == 12.0
    assert info["drops"] == {}


def test_dump_limit_and_formats() -> None:
    r = cli("dump", DEFAULT, "cuda_calls", "--limit", "3", "--format", "json")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(rows) == 3
    assert rows[0]["func"] == "cuMemAlloc_v2"
    r = cli("dump", DEFAULT, "ioctls", "--format", "csv")
    table = list(csv.DictReader(io.StringIO(r.stdout)))
    assert len(table) == 32
    failed = [t for t in table if t["status"] == str(0x51)]
    assert len(failed) == 1 and failed[0]["name"] == "RM_ALLOC"
    r = cli("dump", DEFAULT, "faults", "-n", "2")
    assert r.stdout.startswith("faults: 2 rows")


def test_dump_empty_table_prints_typed_header(tmp_path: object) -> None:
    from gputrace.trace.builder import TraceBuilder

    out = TraceBuilder().build(f"{tmp_path}/t")
    r = cli("dump", str(out), "chunks", "--format", "csv")
    assert r.returncode == 0
    assert r.stdout.strip().split(",")[:2] == ["ts_ns", "gpu_index"]


def test_record_and_analyze_are_listed_in_help() -> None:
    r = cli("--help")
    assert "record" in r.stdout and "analyze" in r.stdout
