"""The torch_allocator layer without BPF: its event struct against the C header, the
allocator tables its decoder writes for a known story of events, the entry points
found in the stand-in libc10_cuda builds (checked against nm and objdump), and the
library watch on this very process."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gputrace.record.library_watch import LibraryWatch
from gputrace.record.torch_allocator import decode, symbols
from gputrace.record.torch_allocator.layer import TorchAllocatorLayer, frames_table

PROBES = Path(__file__).resolve().parents[3] / "probes"
MIB = 1 << 20


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not installed")
def test_event_struct_matches_header(tmp_path: Path) -> None:
    dt = decode.TORCH_DTYPE
    lines = ["#include <stdio.h>", "#include <stddef.h>",
             f'#include "{PROBES / "gputrace_events.h"}"',
             f'#include "{PROBES / "torch_events.h"}"',
             "int main(void) {", 'printf("size %zu\\n", sizeof(struct torch_event));']
    lines += [f'printf("{n} %zu\\n", offsetof(struct torch_event, {n}));' for n in dt.names or ()]
    src = tmp_path / "t.c"
    src.write_text("\n".join([*lines, "return 0; }"]))
    subprocess.run(["gcc", "-DGT_USERSPACE", "-Wall", "-Werror", "-o", str(tmp_path / "t"),
                    str(src)], check=True, capture_output=True)  # fmt: skip
    out = subprocess.run([str(tmp_path / "t")], check=True, capture_output=True, text=True)
    got = {k: int(v) for k, v in (ln.split() for ln in out.stdout.splitlines())}
    assert got["size"] == dt.itemsize
    fields = dt.fields or {}
    assert {n: got[n] for n in dt.names or ()} == {n: fields[n][1] for n in dt.names or ()}
    header = (PROBES / "torch_events.h").read_text()
    kinds = dict(re.findall(r"#define GT_TORCH_(\w+) (\d)", header))
    assert {int(v): k.lower() for k, v in kinds.items()} == decode.KINDS


def _ev(*rows: tuple[int, ...]) -> np.ndarray[Any, Any]:
    """Events from (kind, ts, ptr, size, request, pid, tid, py_stack_id)."""
    ev = np.zeros(len(rows), decode.TORCH_DTYPE)
    for i, (kind, ts, ptr, size, request, pid, tid, py) in enumerate(rows):
        ev[i] = (ts, 0, ptr, size, 0, request, pid, tid, -1, py, 0, 0, kind, 0)
    return ev


SEG, T1, T2 = 0x7000_0000, 0x7000_0000, 0x7000_0400


def test_story_of_events_to_allocator_tables() -> None:
    """A 2 MiB small segment, two tensors (1000 B and 2 KiB), the first freed, a
    free of a pointer allocated before the recording, a cuMemFree of something
    else, then a malloc whose segment call failed and never returned."""
    st = decode.AllocatorState()
    key = (1 + 1) << 32 | 0xFFFFFFFF  # python stack 1, no native stack
    ev = _ev((2, 10, SEG, 2 * MIB, 1000, 7, 70, -1),  # segment_alloc inside malloc
             (0, 9, T1, 1000, 1000, 7, 70, 1),  # alloc, entered before its segment
             (0, 20, T2, 2048, 2048, 7, 70, 1),
             (1, 30, T1, 0, 0, 7, 70, -1),
             (1, 31, 0xdead, 0, 0, 7, 70, -1),  # allocated before the recording
             (3, 32, 0xbeef, 0, 0, 7, 70, -1),  # another library's cuMemFree
             (5, 40, 0, 64 * MIB, 64 * MIB, 7, 71, 1))  # seg_fail, never returned
    t = st.rows(ev, {(7, key): 5})
    assert t is not None
    rows = t.select(["seq", "action", "address", "size_bytes", "stack_id", "ts_ns"]).to_pylist()
    assert [(r["seq"], r["action"], r["address"], r["size_bytes"], r["stack_id"], r["ts_ns"])
            for r in rows] == [
        (0, "segment_alloc", SEG, 2 * MIB, None, 10),
        (1, "alloc", T1, 1024, 5, 9),
        (2, "alloc", T2, 2048, 5, 20),
        (3, "free_requested", T1, 1024, 5, 30),
        (4, "free_completed", T1, 1024, 5, 30)]  # fmt: skip
    oom = st.unsettled()
    assert oom is not None
    assert oom.select(["seq", "action", "size_bytes", "stack_id"]).to_pylist() == [
        {"seq": 5, "action": "oom", "size_bytes": 64 * MIB, "stack_id": 5}]
    tables = st.state_tables()
    seg = tables["allocator_segments"].to_pylist()
    assert [(s["address"], s["total_size_bytes"], s["allocated_size_bytes"],
             s["requested_size_bytes"], s["pool"]) for s in seg] == [
        (SEG, 2 * MIB, 2048, 2048, "small")]
    blocks = tables["allocator_blocks"].to_pylist()
    assert [(b["address"], b["size_bytes"], b["state"]) for b in blocks] == [
        (SEG, 1024, "inactive"), (T2, 2048, "active_allocated"),
        (T2 + 2048, 2 * MIB - 1024 - 2048, "inactive")]


def test_expandable_pages_and_async_tensors_to_allocator_tables() -> None:
    """Three 2 MiB pages of an expandable segment mapped inside mallocs (two runs: the
    third page lies apart), one unmapped, one not the allocator's; a tensor in the
    first run. Then the async backend (result 1): three tensors, one freed and given
    back at its cuMemFreeAsync, one freed and not given back yet (deferred), one
    alive; a cuMemFreeAsync of a pointer it never handed out."""
    st = decode.AllocatorState()
    p0, p1, p2, a1, a2, a3 = 0x8000_0000, 0x8020_0000, 0x9000_0000, 0xa000, 0xb000, 0xc000
    ev = np.zeros(12, decode.TORCH_DTYPE)
    for i, (kind, ts, ptr, size, request, result) in enumerate((
            (6, 1, p0, 2 * MIB, 1000, 0), (6, 2, p1, 2 * MIB, 1000, 0),  # seg_map
            (6, 3, p2, 2 * MIB, 1000, 0),
            (0, 4, p0, 1000, 1000, 0),  # a tensor in the first run
            (7, 5, p2, 2 * MIB, 0, 0), (7, 6, 0x1234, 2 * MIB, 0, 0),  # seg_unmap
            (0, 7, a1, 1000, 1000, 1), (0, 8, a2, 3000, 3000, 1), (0, 9, a3, 5, 5, 1),
            (1, 10, a1, 0, 0, 1), (8, 11, a1, 0, 0, 0),  # freed, then given back
            (1, 12, a2, 0, 0, 1))):  # fmt: skip
        ev[i] = (ts, 0, ptr, size, 0, request, 7, 70, -1, -1, result, 0, kind, 0)
    t = st.rows(ev, {})
    assert t is not None
    assert st.rows(_ev((8, 13, 0xdead, 0, 0, 7, 70, -1)), {}) is None  # not a tensor of it
    assert [(r["action"], r["address"], r["size_bytes"]) for r in t.to_pylist()] == [
        ("segment_map", p0, 2 * MIB), ("segment_map", p1, 2 * MIB),
        ("segment_map", p2, 2 * MIB), ("alloc", p0, 1024), ("segment_unmap", p2, 2 * MIB),
        ("alloc", a1, 1000), ("alloc", a2, 3000), ("alloc", a3, 5),
        ("free_requested", a1, 1000), ("free_completed", a1, 1000),
        ("free_requested", a2, 3000)]  # fmt: skip
    tables = st.state_tables()
    segs = [(s["address"], s["total_size_bytes"], s["allocated_size_bytes"],
             s["active_size_bytes"], s["pool"], s["is_expandable"])
            for s in tables["allocator_segments"].to_pylist()]
    assert segs == [(p0, 4 * MIB, 1024, 1024, "small", True),
                    (a3, 5, 5, 5, "async", False), (a2, 3000, 0, 3000, "async", False)]
    blocks = [(b["segment_address"], b["address"], b["size_bytes"], b["state"])
              for b in tables["allocator_blocks"].to_pylist()]
    assert blocks == [(p0, p0, 1024, "active_allocated"),
                      (p0, p0 + 1024, 4 * MIB - 1024, "inactive"),
                      (a3, a3, 5, "active_allocated"), (a2, a2, 3000, "active_pending_free")]


def test_native_free_deferred_until_its_release() -> None:
    """Thread 70 frees T1, whose free then defers it (insert_events): completed at its
    release; thread 71 frees T2 and allocates: completed at its free's instant, written
    before the next row of that thread; thread 70 frees T3 last: completed at the end.
    A release of a pointer never deferred writes nothing."""
    st = decode.AllocatorState()
    t3 = 0x7000_0800
    first = st.rows(_ev((0, 1, T1, 1000, 1000, 7, 70, -1), (0, 2, T2, 2048, 2048, 7, 71, -1),
                        (0, 3, t3, 512, 512, 7, 70, -1),
                        (1, 10, T1, 0, 0, 7, 70, -1), (1, 11, T2, 0, 0, 7, 71, -1)), {})
    assert first is not None  # T2's completion waits for its thread's next event
    more = st.rows(_ev((9, 12, T1, 0, 0, 7, 70, -1), (0, 13, 0x9000, 512, 512, 7, 71, -1),
                       (8, 14, 0xdead, 0, 0, 7, 72, -1), (8, 20, T1, 0, 0, 7, 72, -1),
                       (1, 21, t3, 0, 0, 7, 70, -1)), {})
    end = st.unsettled()
    assert more is not None and end is not None
    rows = [(r["action"], r["address"], r["ts_ns"]) for t in (first, more, end)
            for r in t.to_pylist()]
    assert rows[3:] == [
        ("free_requested", T1, 10), ("free_requested", T2, 11),
        ("free_completed", T2, 11), ("alloc", 0x9000, 13), ("free_completed", T1, 20),
        ("free_requested", t3, 21), ("free_completed", t3, 21)]  # fmt: skip
    assert not st.pending and not st.undecided


def test_a_malloc_that_returns_after_a_failure_is_no_oom() -> None:
    st = decode.AllocatorState()
    st.rows(_ev((5, 1, 0, MIB, MIB, 7, 70, -1), (0, 1, T1, MIB, MIB, 7, 70, -1)), {})
    assert st.unsettled() is None


def test_frames_from_stack_rows() -> None:
    rows = [{"pid": 7, "stack_id": 11, "depth": 0, "kind": "native", "symbol": "malloc",
             "module": "/x/libc10_cuda.so"},
            {"pid": 7, "stack_id": 11, "depth": 1, "kind": "python", "function": "step",
             "filename": "/w.py", "line": 51},
            {"pid": 8, "stack_id": 11, "depth": 0, "kind": "python", "function": "other",
             "filename": "/o.py", "line": 1}]  # fmt: skip
    t = frames_table(rows, {(7, 11): 3})
    assert t.to_pylist() == [
        {"stack_id": 3, "depth": 0, "function": "malloc", "filename": "/x/libc10_cuda.so",
         "line": None},
        {"stack_id": 3, "depth": 1, "function": "step", "filename": "/w.py", "line": 51}]


def test_no_library_no_allocator_layer() -> None:
    """A recording where no process maps libc10_cuda: the manifest says so, the trace
    claims no allocator layer."""
    frag = TorchAllocatorLayer("python")._manifest()
    assert "layers" not in frag
    assert frag["torch_allocator"] == {"stacks": "python", "libraries": [], "attached": [],
                                       "skipped": []}


def _built() -> Any:
    from tests.standin_torch import standin_torch as st

    try:
        st.build()
    except Exception as e:  # no g++/make here
        pytest.skip(f"stand-in not built: {e}")
    return st


def _nm(path: Path) -> dict[str, int]:
    out = subprocess.run(["nm", str(path)], capture_output=True, text=True, check=True).stdout
    return {p[2]: int(p[0], 16) for p in (ln.split() for ln in out.splitlines()) if len(p) == 3}


@pytest.mark.skipif(shutil.which("nm") is None or shutil.which("objdump") is None,
                    reason="binutils not installed")
def test_entry_points_of_the_stand_in_builds() -> None:
    st = _built()
    inlined = [(symbols.LOCAL_RAW_DELETE, 1), (symbols.RAW_DELETE, 2)]
    for lib, release, malloc, frees in (
            (st.LIB, "2.14", symbols.MALLOC, [(symbols.FREE, 2)]),
            (st.LIB_2_5, "2.5", symbols.MALLOC, inlined),
            (st.LIB_2_1, "2.1", symbols.MALLOC_INT_DEVICE, inlined)):
        e = symbols.find(str(lib))
        nm = _nm(lib)
        assert (e.release, e.malloc) == (release, nm[malloc])
        assert list(e.frees) == [(nm[name], arg) for name, arg in frees]
        # every `ret` objdump sees inside malloc, and nothing else
        end = min(a for a in nm.values() if a > e.malloc)
        dis = subprocess.run(["objdump", "-d", f"--start-address={e.malloc}",
                              f"--stop-address={end}", str(lib)], capture_output=True,
                             text=True, check=True).stdout  # fmt: skip
        rets = [int(m, 16) for m in re.findall(r"^\s*([0-9a-f]+):.*\sret\b", dis, re.M)]
        assert list(e.malloc_rets) == rets and rets
        # the async backend's, in every shape: 2.1's takes an int device
        am = symbols.MALLOC_ASYNC_INT_DEVICE if release == "2.1" else symbols.MALLOC_ASYNC
        assert (e.async_malloc, e.async_free) == (nm[am], nm[symbols.FREE_ASYNC])
        end = min(a for a in nm.values() if a > e.async_malloc)
        dis = subprocess.run(["objdump", "-d", f"--start-address={e.async_malloc}",
                              f"--stop-address={end}", str(lib)], capture_output=True,
                             text=True, check=True).stdout  # fmt: skip
        rets = [int(m, 16) for m in re.findall(r"^\s*([0-9a-f]+):.*\sret\b", dis, re.M)]
        assert list(e.async_rets) == rets and rets
    with pytest.raises(symbols.SymbolsMissing, match=r"no NativeCachingAllocator::malloc/free "
                       r"in \.symtab"):  # fmt: skip
        symbols.find(str(st.LIB_UNKNOWN))
    with pytest.raises(symbols.SymbolsMissing, match="no NativeCachingAllocator"):
        symbols.find("/bin/true")


def test_library_watch_hands_each_file_once() -> None:
    """This process maps its libc: a subscriber for it hears of it once."""
    libc = next(ln.split(None, 5)[5] for ln in Path("/proc/self/maps").read_text().splitlines()
                if re.search(r"/libc[.-][\w.-]*so", ln))
    heard: list[tuple[str, str, int]] = []
    w = LibraryWatch()
    w.subscribe(r"^" + re.escape(os.path.basename(libc)) + "$", lambda *a: heard.append(a))
    w.subscribe(r"^libc10_cuda\.so$", lambda *a: heard.append(("torch", *a)))
    w.scan(os.getpid())
    w.scan(os.getpid())
    assert heard == [(libc, libc, os.getpid())]
