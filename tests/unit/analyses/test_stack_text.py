"""A stack in words: Python frames as `function (file:line)`, native ones as their
symbol or address, innermost first (helpers/stacks.py, the one place)."""

from __future__ import annotations

import polars as pl

from gputrace.analyses.helpers.stacks import stack_frames
from gputrace.schema import STACKS


def test_python_and_native_frames_in_one_stack() -> None:
    rows = [
        {"pid": 7, "stack_id": 1, "depth": 0, "ip": 0x1000, "module": "/lib/libcuda.so.1",
         "offset": 0x40, "symbol": "cuMemAlloc_v2", "kind": "native"},
        {"pid": 7, "stack_id": 1, "depth": 1, "ip": 0x2000, "module": "/lib/libffi.so.8",
         "offset": 0x6F7A, "symbol": None, "kind": "native"},
        {"pid": 7, "stack_id": 1, "depth": 2, "ip": 0x7F00, "offset": 12, "kind": "python",
         "function": "Model.forward", "filename": "/src/app/model.py", "line": 64},
        {"pid": 7, "stack_id": 1, "depth": 3, "ip": 0x7F80, "offset": 0, "kind": "python",
         "function": None, "filename": None, "line": None},  # the process exited first
        # a trace written before Python frames: no kind at all
        {"pid": 7, "stack_id": 2, "depth": 0, "ip": 0x3000, "module": None, "offset": None,
         "symbol": None},
    ]
    df = pl.DataFrame(rows, schema=STACKS.polars_schema)
    got = stack_frames(df.lazy()).collect().sort("stack_id").select(
        "pid", "stack_id", "frames", "site").rows()
    # `site` (terminal tables) is the CUDA call and the first frame of the user's code
    assert got == [(7, 1, "cuMemAlloc_v2 < libffi.so.8+0x6f7a < Model.forward (model.py:64) "
                          "< ? (?:?)", "cuMemAlloc_v2 < Model.forward (model.py:64)"),
                   (7, 2, "0x3000", "0x3000")]
