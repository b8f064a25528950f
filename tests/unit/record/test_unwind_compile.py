"""Tables are compiled in a worker process, never in the recorder's own thread
(gputrace/record/unwind/tables.py, `Compiler`): a stopped process waits at most the
bounded wait for them, later ones are loaded by `poll` as they finish, and a compile
that fails or whose worker dies leaves frame pointers and a reason in the manifest.

Why: on the H200 (driver 580.159.04, PyTorch 2.11) compiling the tables of a PyTorch
process's ~60 libraries in the recorder held the process, stopped at its libcuda load,
for over two minutes. The compiles here are stand-ins (futures this test completes)
except in the last test, which compiles the stand-in caching allocator
(tests/standin_cuda/caching_alloc.c) in a real worker."""

from __future__ import annotations

import concurrent.futures as cf
import os
import sys
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import pytest

from gputrace.record.api.symbolize import Mapping
from gputrace.record.unwind import cfi, tables
from gputrace.record.unwind.tables import UnwindTables

ELF = os.path.realpath(sys.executable)  # any ELF file: its mapping's link address is read
TABLE = cfi.UnwindTable(rows=[cfi.Row(0x1000, cfi.CFA_RSP, 8), cfi.Row(0x1100, cfi.STOP)],
                        functions=1, fp_functions=0, code_bytes=0x100)


class Futures:
    """A Compiler whose compiles finish when the test says."""

    cache_dir = None

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.futures: list[cf.Future[cfi.UnwindTable]] = []

    def submit(self, path: str) -> cf.Future[cfi.UnwindTable]:
        self.asked.append(path)
        self.futures.append(cf.Future())
        return self.futures[-1]

    def close(self) -> None:
        pass


@pytest.fixture
def unwind(monkeypatch: pytest.MonkeyPatch) -> tuple[UnwindTables, Futures, dict[str, Any]]:
    stored: dict[str, Any] = {"rows": {}, "procs": {}}
    monkeypatch.setattr(UnwindTables, "_store_rows",
                        lambda self, first, rows: stored["rows"].update({first: rows}))
    monkeypatch.setattr(UnwindTables, "_store_proc",
                        lambda self, pid, entries: stored["procs"].update({pid: entries}))
    futures = Futures()
    return UnwindTables(bpf=None, compiler=futures), futures, stored  # type: ignore[arg-type]


MAPS = [Mapping(start=0x7000_0000, end=0x7000_4000, pgoff=0, path=ELF)]


def test_a_stopped_process_waits_only_the_bounded_wait(
        unwind: tuple[UnwindTables, Futures, dict[str, Any]]) -> None:
    u, futures, stored = unwind
    u.update(42, MAPS, wait_s=0.01)  # never finished: returns after the wait
    assert futures.asked == [f"/proc/42/root{ELF}"] and not stored["procs"].get(42)
    assert not u.poll()
    futures.futures[0].set_result(TABLE)
    assert u.poll()  # loaded, and given to the process that maps it
    assert stored["rows"] == {0: TABLE.rows}
    [(start, end, _bias, row, rows)] = stored["procs"][42]
    assert (start, end, row, rows) == (0x7000_0000, 0x7000_4000, 0, 2)
    assert u.manifest()["tables"] == [{"module": ELF, "rows": 2}]
    # compiled once per file: a second process mapping it gets it at once
    u.update(43, list(MAPS))
    assert len(futures.asked) == 1 and stored["procs"][43] == stored["procs"][42]


def test_every_process_waiting_for_a_file_gets_it_and_no_other_is_ranked_again(
        unwind: tuple[UnwindTables, Futures, dict[str, Any]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    u, futures, stored = unwind
    u.update(42, MAPS)
    u.update(43, list(MAPS))  # the same file, asked for once
    u.update(44, [])  # maps nothing with a table
    assert len(futures.asked) == 1
    ranked: list[int] = []
    assign = UnwindTables._assign
    monkeypatch.setattr(UnwindTables, "_assign",
                        lambda self, pid, maps: (ranked.append(pid), assign(self, pid, maps)))
    futures.futures[0].set_result(TABLE)
    assert u.poll()
    assert ranked == [42, 43]
    assert stored["procs"][42] == stored["procs"][43] and stored["procs"][42]


def test_a_compile_finished_within_the_wait_is_used_at_once(
        unwind: tuple[UnwindTables, Futures, dict[str, Any]]) -> None:
    u, futures, stored = unwind

    def submit(path: str) -> cf.Future[cfi.UnwindTable]:
        f: cf.Future[cfi.UnwindTable] = cf.Future()
        f.set_result(TABLE)
        return f

    futures.submit = submit  # type: ignore[method-assign]
    u.update(42, MAPS, wait_s=0.5)
    assert stored["procs"][42][0][3:] == (0, 2)


@pytest.mark.parametrize(("error", "reason"), [
    (cfi.CfiError(f"/proc/42/root{ELF}: more than 65536 unwind rows"),
     "more than 65536 unwind rows"),
    (BrokenProcessPool("worker died"), "not compiled (BrokenProcessPool)"),
    (cf.CancelledError(), "not compiled (CancelledError)"),
])
def test_a_failed_compile_leaves_frame_pointers_and_says_why(
        unwind: tuple[UnwindTables, Futures, dict[str, Any]], error: Exception,
        reason: str) -> None:
    u, futures, stored = unwind
    u.update(42, MAPS)
    futures.futures[0].set_exception(error)
    assert u.poll()
    assert not stored["procs"].get(42)
    assert u.manifest()["skipped"] == [{"module": ELF, "reason": reason}]
    u.update(43, list(MAPS))
    assert len(futures.asked) == 1  # not asked again


def test_a_real_worker_compiles_what_the_recorder_would() -> None:
    pytest.importorskip("elftools")
    from tests.standin_cuda.standin_cuda import build, skip_reason

    if skip_reason() is not None:
        pytest.skip(str(skip_reason()))
    lib = str(build().lib_dir / "libcaching_standin.so")
    compiler = tables.Compiler()
    try:
        got = compiler.submit(lib).result(timeout=120)
    finally:
        compiler.close()
    assert got == cfi.compile_file(lib, tables.TABLE_ROWS)
    assert not got.has_frame_pointers and len(got.rows) > 10
    assert compiler.pool is None


def test_a_table_of_another_file_than_the_one_asked_for_is_not_loaded(
        unwind: tuple[UnwindTables, Futures, dict[str, Any]]) -> None:
    """The worker read another file under the name than the one the recorder opened (a
    name flipped between the two opens): its rows are not kept under this file's
    identity, where every process mapping the real file would walk them."""
    import dataclasses

    u, futures, stored = unwind
    u.update(42, MAPS)
    st = os.stat(ELF)
    futures.futures[0].set_result(dataclasses.replace(TABLE, file=(st.st_dev, st.st_ino + 1)))
    assert u.poll()
    assert not stored["rows"] and not stored["procs"].get(42)
    assert u.manifest()["skipped"] == [
        {"module": ELF, "reason": "the file changed while its table was compiled"}]
