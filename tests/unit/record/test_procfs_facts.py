"""Each /proc fact is declared once (procfs.PROC_FACTS: field, file, parse): it fills a
ProcInfo field that is a processes column (or the identity columns), `read_info` reads
each from its file, `copy_facts` copies each, and docs/record.md lists each."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from gputrace import identity, schema
from gputrace.record import procfs
from tests.conftest import ROOT


def test_each_fact_fills_a_processes_column() -> None:
    fields = {f.name for f in dataclasses.fields(procfs.ProcInfo)}
    columns = {c.name for c in schema.PROCESSES.columns}
    for f in procfs.PROC_FACTS:
        assert f.field in fields, f.field
        assert f.field == "identity" or f.field in columns, f.field
    assert len({f.field for f in procfs.PROC_FACTS}) == len(procfs.PROC_FACTS)


def test_read_info_reads_each_fact_of_this_process() -> None:
    """This test's own process, read by hand beside read_info."""
    pid = os.getpid()
    info = procfs.read_info(pid)
    base = Path("/proc") / str(pid)
    raw = (base / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    assert info.exe == os.readlink(base / "exe")
    assert info.cmdline == " ".join(a.decode("utf-8", "replace") for a in raw)
    text = (base / "cgroup").read_text()
    assert info.cgroup == identity.proc_cgroup_paths(text)[0]
    assert info.identity == identity.from_proc_cgroup(text)
    assert info.comm is not None and info.ppid == os.getppid()


def test_copy_facts_copies_every_fact_and_nothing_else() -> None:
    src = procfs.read_info(os.getpid())
    dst = procfs.ProcInfo(99, ppid=1, comm="other")
    procfs.copy_facts(dst, src)
    for f in procfs.PROC_FACTS:
        assert getattr(dst, f.field) == getattr(src, f.field), f.field
    assert (dst.pid, dst.ppid, dst.comm) == (99, 1, "other")


def test_record_doc_lists_each_fact() -> None:
    doc = (ROOT / "docs" / "record.md").read_text()
    assert procfs.facts_table() in doc
    for f in procfs.PROC_FACTS:
        assert f"| `{f.file}` | {f.how} |" in doc
