"""Which of a process's libraries without frame pointers get its MAPS table slots
(gputrace/record/unwind/tables.py): the interpreter first, then the libraries its
recorded stacks showed frames in, then the rest by address; a library first seen on a
stack takes the slot of one never seen there.

Synthetic: eleven libraries without frame pointers mapped 1 MiB apart (the compiled
tables stubbed: each file's table is its index), the interpreter's the highest; the
answers are written beside each step."""

from __future__ import annotations

from typing import Any

import pytest

from gputrace.record.api.symbolize import Mapping
from gputrace.record.unwind import tables
from gputrace.record.unwind.tables import MAPS, UnwindTables

MIB = 1 << 20
LIBS = [f"/opt/lib/libnofp{i}.so" for i in range(10)] + ["/usr/lib/libpython3.11.so.1.0"]
MAPS_OF = [Mapping(start=(i + 1) * MIB, end=(i + 1) * MIB + 4096, pgoff=0, path=p)
           for i, p in enumerate(LIBS)]


class _Procs:
    """`unwind_procs` as forget() uses it (entries are stored by the stub below)."""

    def __delitem__(self, key: object) -> None:
        raise KeyError(key)


@pytest.fixture
def slots(monkeypatch: pytest.MonkeyPatch) -> tuple[UnwindTables, dict[int, list[str]]]:
    stored: dict[int, list[str]] = {}

    def for_file(self: UnwindTables, pid: int, path: str, pgoff: int) -> tuple[Any, int]:
        return tables._Table(row=LIBS.index(path), rows=1), 0

    def store(self: UnwindTables, pid: int, entries: list[tuple[int, ...]]) -> None:
        stored[pid] = [LIBS[e[3]] for e in entries]  # row = the library's index

    monkeypatch.setattr(UnwindTables, "_for_file", for_file)
    monkeypatch.setattr(UnwindTables, "_store_proc", store)
    return UnwindTables(bpf={"unwind_procs": _Procs()}), stored


def crowded(u: UnwindTables) -> list[str]:
    return [s["module"] for s in u.manifest()["skipped"] if s["reason"] == tables.CROWDED]


def test_interpreter_first_then_by_address(
        slots: tuple[UnwindTables, dict[int, list[str]]]) -> None:
    u, stored = slots
    u.update(7, MAPS_OF)
    # the interpreter, then the 7 lowest addresses; stored in address order
    assert stored[7] == [*LIBS[:7], LIBS[10]]
    assert crowded(u) == LIBS[7:10]


def test_a_library_seen_on_a_stack_takes_a_slot(
        slots: tuple[UnwindTables, dict[int, list[str]]]) -> None:
    u, stored = slots
    u.update(7, MAPS_OF)
    # a walk that ended in libnofp9 (no table yet): the frame that entered it
    u.saw_stack(7, [5 * MIB + 16, 10 * MIB + 100])
    # libnofp9 in; libnofp6, the highest never seen on a stack, out
    assert stored[7] == [*LIBS[:6], LIBS[9], LIBS[10]]
    assert crowded(u) == LIBS[6:9]
    # one more seen: it takes the next unseen slot (libnofp5), libnofp9 stays
    u.saw_stack(7, [8 * MIB + 1])
    assert stored[7] == [*LIBS[:5], LIBS[7], LIBS[9], LIBS[10]]
    # addresses in libraries with a slot, or in none, change nothing
    before = list(stored[7])
    u.saw_stack(7, [1 * MIB + 1, 50 * MIB])
    assert stored[7] == before
    # the maps read again (a library loaded since): the choice is kept
    u.update(7, list(MAPS_OF))
    assert stored[7] == before


def test_more_libraries_seen_than_slots_keep_the_first_seen(
        slots: tuple[UnwindTables, dict[int, list[str]]]) -> None:
    u, stored = slots
    u.update(7, MAPS_OF)
    u.saw_stack(7, [(i + 1) * MIB + 8 for i in range(9, -1, -1)])  # all ten, 9 first
    assert len(stored[7]) == MAPS
    assert stored[7] == [*LIBS[3:10], LIBS[10]]  # interpreter + the first 7 seen (9..3)


def test_libraries_with_slots_seen_on_stacks_keep_them(
        slots: tuple[UnwindTables, dict[int, list[str]]]) -> None:
    u, stored = slots
    u.update(7, MAPS_OF)
    u.saw_stack(7, [(i + 1) * MIB + 8 for i in range(7)])  # the seven with slots: used
    u.saw_stack(7, [8 * MIB + 8])  # libnofp7, without one: all seven are used, it waits
    assert stored[7] == [*LIBS[:7], LIBS[10]]
    assert crowded(u) == LIBS[7:10]


def test_forget_drops_what_a_process_showed(
        slots: tuple[UnwindTables, dict[int, list[str]]]) -> None:
    u, stored = slots
    u.update(7, MAPS_OF)
    u.saw_stack(7, [10 * MIB + 1])
    u.forget(7)
    assert 7 not in u.on_stacks and 7 not in u.tabled and 7 not in u.slotted
    u.update(7, MAPS_OF)  # the pid reused: chosen afresh
    assert stored[7] == [*LIBS[:7], LIBS[10]]
