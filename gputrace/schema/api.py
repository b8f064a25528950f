"""Tables of the API layer: CUDA driver API memory calls (uprobes on libcuda) and the
user call stacks they were made from.
"""

from __future__ import annotations

from gputrace.schema import model
from gputrace.schema.model import I32, I64, STR, U16, U64, Column, Table, who

CUDA_CALLS = Table(
    "cuda_calls",
    "CUDA driver API memory calls (uprobes on libcuda).",
    "api",
    (
        *who(),
        Column("func", STR, "", "libcuda symbol, e.g. cuMemAlloc_v2", False),
        Column("size_bytes", U64, "bytes", "requested size"),
        Column("ptr", U64, "address", "device pointer returned (allocs) or passed (frees)"),
        Column("handle", U64, "", "CUmemGenericAllocationHandle or pool handle"),
        Column("flags", U64, "", "flags argument"),
        Column("stream", U64, "", "CUstream argument of async calls"),
        Column("result", I32, "", "CUresult returned (0 = CUDA_SUCCESS)"),
        Column("latency_ns", I64, "ns", "time from call to return"),
        Column("stack_id", I64, "", "key into the stacks table (with pid); null when none. "
               "With Python frames: (Python stack id + 1) << 32 | native stack id "
               "(0xffffffff when the native walk got none)"),
    ),
)

STACKS = Table(
    "stacks",
    "Symbolized user call stacks, one row per frame, innermost first: native frames "
    "and, in a CPython process, its Python frames in place of the interpreter's eval loop.",
    "api",
    (
        Column("pid", I32, "", "process whose address space the addresses belong to", False),
        Column("stack_id", I64, "", "stack id referenced by cuda_calls.stack_id", False),
        Column("depth", U16, "", "frame index, 0 = innermost", False),
        Column("ip", U64, "address", "instruction pointer", False),
        Column("module", STR, "", "path of the mapped object holding ip (null if unknown)"),
        Column("offset", U64, "bytes", "ip relative to the module's load base"),
        Column("symbol", STR, "", "function name (null when it could not be resolved)"),
        Column("kind", STR, "", "native (a machine address) or python (an interpreter "
               "frame: ip is its code object's address, offset its bytecode offset)", since=4),
        Column("function", STR, "", "Python frames: qualified function name (null when "
               "the process exited before it was read)", since=4),
        Column("filename", STR, "", "Python frames: source file", since=4),
        Column("line", I32, "", "Python frames: source line", since=4),
    ),
)

CATALOG = model.Catalog(("api",), (CUDA_CALLS, STACKS))
"""This module's layers and tables, in catalog order (`schema.CATALOG_MODULES`)."""
