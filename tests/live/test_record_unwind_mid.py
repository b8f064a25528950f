"""Native frames through a library without frame pointers in the MIDDLE of a
stack, as libcudart and libc10_cuda sit under libtorch and Python's
interpreter: does every segment allocation of
  main -> run_mid -> mid_outer (libmid_a.so, -fomit-frame-pointer)
       -> mid_middle (libmid_b.so, frame pointers)
       -> cache_alloc -> grow_segment (libcaching_standin.so, none) -> cuMemAlloc_v2
(tests/standin_cuda/mid_libs.c, mid_program.c) carry exactly those frames?

The unwinder before (tables for the top frames while they lie in libraries
with one, then frame pointers only) walked libcaching_standin by its table,
then mid_middle's record by %rbp: its return address is right (mid_outer), but
the %rbp it saved is run_mid's (mid_outer keeps none and leaves %rbp alone), so
the next record read was run_mid's and run_mid was lost without a sign:
[grow_segment, cache_alloc, mid_middle, mid_outer, main, libc] (recorded with
the step program left out of unwind_tails). The whole-stack walk asks each
frame's library for its row, mid_outer's too.

The first allocation of the process is walked whole too: the recorder reads the
process's mappings, and gives its libraries their tables, when it stops at its
libcuda's load, before its first call (until then only at its first call's return,
so the first allocation was walked by frame pointers alone: one frame,
grow_segment, which keeps a size in %rbp, not a frame pointer)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.record_helpers import live_skip_reason, record_alloc_stacks, return_addresses

SEGMENTS = 3


@pytest.mark.live
@pytest.mark.skipif(live_skip_reason() is not None, reason=str(live_skip_reason()))
def test_unwinder_recovers_a_library_without_frame_pointers_mid_stack(tmp_path: Path) -> None:
    from tests.standin_cuda.standin_cuda import build

    d = build().lib_dir
    exe, a, b, c = (d / "mid_program", d / "libmid_a.so", d / "libmid_b.so",
                    d / "libcaching_standin.so")  # fmt: skip
    prog, ra, rb, rc = (return_addresses(x) for x in (exe, a, b, c))
    t, stacks, stdout = record_alloc_stacks(
        tmp_path / "trace", ["--", str(exe), str(SEGMENTS)], SEGMENTS,
        ("module", "offset", "symbol"), 300)
    assert f"segments {SEGMENTS}" in stdout
    api = t.manifest["api"]
    assert api["unwind"]["walk"] == "whole stack"
    # the two without frame pointers; libmid_b, the program, libc and the
    # stand-in libcuda keep them and get none
    assert sorted(x["module"] for x in api["unwind"]["tables"]) == sorted([str(a), str(c)])
    libc = stacks[-1][-1]
    assert libc[0] is not None and os.path.basename(libc[0]).startswith("libc.so")
    grow = (str(c), rc[("grow_segment", "cuMemAlloc_v2")], "grow_segment")
    full = [
        grow,
        (str(c), rc[("cache_alloc", "grow_segment")], "cache_alloc"),
        (str(b), rb[("mid_middle", "cache_alloc")], "mid_middle"),
        (str(a), ra[("mid_outer", "mid_middle")], "mid_outer"),
        (str(exe), prog[("run_mid", "mid_outer")], "run_mid"),
        (str(exe), prog[("main", "run_mid")], "main"),
        libc,
    ]
    assert stacks == [full] * SEGMENTS


PY_MID = Path(__file__).resolve().parents[1] / "standin_cuda" / "py_mid.py"


@pytest.mark.live
@pytest.mark.skipif(live_skip_reason() is not None, reason=str(live_skip_reason()))
def test_unwinder_mid_stack_under_python_ctypes(tmp_path: Path) -> None:
    """The same chain called from Python through ctypes (tests/standin_cuda/py_mid.py),
    the process recorded with -p (its tables loaded at start: its first allocation
    too is walked whole): the native frames down to mid_outer exactly, then the
    Python frames of the call, tensor (the planted line) < model < main, in order.

    Below mid_outer the walk goes on through libffi (no frame pointers: its table)
    and _ctypes to ffi_call < _ctypes_callproc < PyCFuncPtr_call; the top-frames
    walk stopped after mid_outer at one unnamed libffi frame. It goes on through
    libpython (built without frame pointers too), whose table takes the first slot
    (the interpreter first: when the 8 slots went by address, the interpreter's
    small extension modules took them and the walk stopped in libpython), so the
    Python frames stand where the eval loop was and the interpreter's own callers
    (... Py_RunMain < Py_BytesMain < libc) follow them."""
    import sys

    import polars as pl

    from gputrace.trace.reader import open_trace
    from tests.record_helpers import record_waiting_program
    from tests.standin_cuda.standin_cuda import build

    d = build().lib_dir
    a, b, c = d / "libmid_a.so", d / "libmid_b.so", d / "libcaching_standin.so"
    ra, rb, rc = (return_addresses(x) for x in (a, b, c))
    lines = PY_MID.read_text().splitlines()
    plant = next(i for i, x in enumerate(lines, 1) if x.endswith("# PLANT: tensor"))
    in_model = next(i for i, x in enumerate(lines, 1) if "if tensor(i) == 0" in x)
    in_main = next(i for i, x in enumerate(lines, 1) if x.strip() == "model(n)")
    out = tmp_path / "trace"
    record_waiting_program(out, [sys.executable, str(PY_MID), str(d), str(SEGMENTS)])
    t = open_trace(out)
    assert t.manifest["api"]["unwind"]["walk"] == "whole stack"
    calls = t.scan("cuda_calls").collect()
    ids = calls.filter(pl.col("func") == "cuMemAlloc_v2")["stack_id"].to_list()
    assert len(ids) == SEGMENTS and len(set(ids)) == 1
    rows = t.scan("stacks").collect().filter(pl.col("stack_id") == ids[0]).sort("depth")
    native = rows.filter(pl.col("kind") == "native").select("module", "offset", "symbol")
    assert native.rows()[:4] == [
        (str(c), rc[("grow_segment", "cuMemAlloc_v2")], "grow_segment"),
        (str(c), rc[("cache_alloc", "grow_segment")], "cache_alloc"),
        (str(b), rb[("mid_middle", "cache_alloc")], "mid_middle"),
        (str(a), ra[("mid_outer", "mid_middle")], "mid_outer"),
    ]
    symbols = [x for x in native["symbol"].to_list()[4:] if x]
    calls = ["ffi_call", "_ctypes_callproc", "PyCFuncPtr_call"]
    assert [x for x in symbols if x in calls] == calls
    py = rows.filter(pl.col("kind") == "python").select("function", "filename", "line")
    assert py.rows()[:3] == [("tensor", str(PY_MID), plant), ("model", str(PY_MID), in_model),
                             ("main", str(PY_MID), in_main)]  # fmt: skip
    # the Python frames stand where the interpreter's eval loop was: below mid_outer,
    # and the interpreter's native callers below them, to libc
    kinds = rows["kind"].to_list()
    first_py = kinds.index("python")
    assert first_py > 4, rows
    below = rows[first_py + 3:].filter(pl.col("kind") == "native")["symbol"].to_list()
    # (the python executable's main tail-jumps to Py_BytesMain: no frame of its own)
    assert below[-3:] == ["Py_RunMain", "Py_BytesMain", "__libc_start_call_main"], below
    assert any(x["module"].startswith(("/", "lib")) and "python" in x["module"]
               for x in t.manifest["api"]["unwind"]["tables"]), t.manifest["api"]["unwind"]
