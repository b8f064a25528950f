"""The API layer's attach to a file it refuses (no BPF: the refusal comes before any
probe). A FIFO named libcuda.so.1 is refused at once as not a regular file, and the
manifest is due at the next drain: nothing else may have to change for the reason to
reach the trace."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gputrace.record.api import libcuda as cuda


def _bare() -> Any:
    api: Any = object.__new__(cuda.LibcudaProbes)
    api.inodes, api.skipped, api.libraries, api.changed = set(), [], [], False
    return api


def test_a_refused_file_is_said_and_makes_the_manifest_due(tmp_path: Path) -> None:
    fifo = tmp_path / "libcuda.so.1"
    os.mkfifo(fifo)
    api = _bare()
    assert api.attach(str(fifo)) is False
    assert api.skipped == [{"name": f"uprobe:*@{fifo}", "reason": f"{fifo}: not a regular file"}]
    assert api.changed is True
    assert api.libraries == []
    api.changed = False  # the same inode again: nothing new to say
    assert api.attach(str(fifo)) is False
    assert api.changed is False and len(api.skipped) == 1


def test_a_file_that_is_not_elf_is_refused_with_its_reason(tmp_path: Path) -> None:
    lib = tmp_path / "libcuda.so.1"
    lib.write_bytes(b"not an ELF file at all" * 4)
    api = _bare()
    assert api.attach(str(lib)) is False
    assert [s["name"] for s in api.skipped] == [f"uprobe:*@{lib}"]
    assert str(lib) in api.skipped[0]["reason"] and api.changed is True
