"""The docs' generated blocks are what the code writes now (a stale one fails, naming the
command that rewrites it), and a report registered in a test appears in them with no
other edit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gputrace import docblocks
from gputrace.analyses import catalog
from tests.conftest import ROOT
from tests.unit.analyses.test_registry import TOY, registered


def test_generated_blocks_are_current() -> None:
    assert docblocks.stale() == [], "run `python3 -m gputrace.docblocks`"


def test_every_block_has_its_markers() -> None:
    for (doc, name) in docblocks.BLOCKS:
        text = (ROOT / doc).read_text()
        assert f"<!-- generated: {name} " in text and f"<!-- end generated: {name} -->" in text


def test_a_stale_block_fails_the_check(tmp_path: Path) -> None:
    """A copy of the docs with a report row deleted from a block: `--check` exits 1
    naming the block; writing puts the row back."""
    (doc, name), _ = next(iter(docblocks.BLOCKS.items()))
    for d, _n in docblocks.BLOCKS:
        (tmp_path / d).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / d).write_text((ROOT / d).read_text())
    f = tmp_path / doc
    f.write_text(f.read_text().replace("| `leaks` |", "| `leak` |", 1))
    assert docblocks.stale(tmp_path) == [f"{doc}: {name}"]
    docblocks.write(tmp_path)
    assert docblocks.stale(tmp_path) == [] and f.read_text() == (ROOT / doc).read_text()


def test_check_command_exits_zero_on_current_docs() -> None:
    r = subprocess.run([sys.executable, "-m", "gputrace.docblocks", "--check"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_registered_report_is_in_the_generated_tables() -> None:
    with registered(TOY):
        tables = catalog.reports_table() + catalog.json_keys_table()
        assert docblocks.stale() != []
    assert "| `toy-count` | `toy_count` | How many toys are there? | `api` |" in tables
    assert "| `toy_count` | object or null |" in tables


def test_fill_refuses_a_missing_block() -> None:
    with pytest.raises(ValueError, match="no generated block"):
        docblocks.fill("text\n", "nope", "x")
