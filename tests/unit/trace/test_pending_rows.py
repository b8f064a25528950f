"""Rows of processes still running are on disk from the rotation after they are
learned (the processes table's PENDING file), so a recorder killed later keeps them:
`gputrace convert` turns them into a part (less rows a part already holds), readers
say they are there until then, a finished recording leaves no PENDING file, and
`--force` replaces a trace holding one. SYNTHETIC rows; no recorder, no root."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from gputrace import schema
from gputrace.importers.raw import convert
from gputrace.trace.files import PENDING
from gputrace.trace.reader import open_trace
from gputrace.trace.writer import TraceWriter


def _procs(*rows: dict[str, Any]) -> pa.Table:
    full = [{c.name: r.get(c.name) for c in schema.PROCESSES.columns} for r in rows]
    return pa.Table.from_pylist(full, schema=schema.PROCESSES.arrow_schema)


EXITED = {"pid": 10, "comm": "gone", "start_ts_ns": 5, "exit_ts_ns": 50, "exit_code": 0}
RUNNING = {"pid": 11, "comm": "alive", "cmdline": "alive --x", "start_ts_ns": 7}
SEEDED = {"pid": 12, "comm": "before"}  # running before the recording: no start time


def test_killed_recording_keeps_running_processes_after_convert(tmp_path: Path) -> None:
    """Guards the SIGKILL loss: the rows of processes still running at the last
    rotation survive the recorder (PENDING), `convert` makes them a part, and a row
    the parts already hold (written, then killed before PENDING was replaced) is
    not doubled."""
    out = tmp_path / "t"
    w = TraceWriter(out, manifest={"start_ts_ns": 0})
    w.append("processes", _procs(EXITED))
    w.rotate()
    w.set_pending("processes", _procs(EXITED, RUNNING, SEEDED))
    w._close_fds()  # killed: no close()
    assert (out / "processes" / PENDING).is_file()
    assert any(PENDING in x for x in open_trace(out).warnings())
    done = convert(out)
    assert done.pending == 2
    t = open_trace(out)
    rows = t.scan("processes").collect().sort("pid")
    assert rows["pid"].to_list() == [10, 11, 12]
    assert rows["cmdline"].to_list()[1] == "alive --x"
    assert t.manifest["tables"]["processes"] == {"rows": 3, "parts": 2}
    assert not (out / "processes" / PENDING).exists()
    assert t.warnings() == []
    assert convert(out).pending == 0  # run again: nothing left to keep


def test_finished_recording_leaves_no_pending_rows(tmp_path: Path) -> None:
    """Guards doubling: close() removes PENDING (the final rows are in the parts)."""
    out = tmp_path / "t"
    w = TraceWriter(out)
    w.set_pending("processes", _procs(RUNNING))
    w.append("processes", _procs(RUNNING))
    w.close()
    assert not (out / "processes" / PENDING).exists()
    assert open_trace(out).scan("processes").collect().height == 1


def test_empty_pending_removes_the_file(tmp_path: Path) -> None:
    """Guards stale rows: once no process is running, no PENDING file is left."""
    out = tmp_path / "t"
    w = TraceWriter(out)
    w.set_pending("processes", _procs(RUNNING))
    w.set_pending("processes", None)
    assert not (out / "processes" / PENDING).exists()
    w.close()


def test_force_replaces_a_killed_trace_with_pending_rows(tmp_path: Path) -> None:
    """`--force` deletes a PENDING file the recorder wrote (it would otherwise refuse
    the directory as holding a Parquet file its manifest does not list)."""
    out = tmp_path / "t"
    w = TraceWriter(out)
    w.set_pending("processes", _procs(RUNNING))
    w._close_fds()
    TraceWriter(out, force=True).close()
    assert not (out / "processes").exists() or not (out / "processes" / PENDING).exists()
