"""Tables of the allocator layer: the state and history of PyTorch's CUDA caching
allocator, imported from a memory snapshot (`gputrace import torch-snapshot`,
docs/importers.md) or recorded live by the torch_allocator recorder layer
(docs/record.md: the state tables then say what was alive at the end).

The caching allocator takes big pieces of device memory from CUDA (segments, each one
`cudaMalloc`, what the API layer's `cuMemAlloc` calls see) and carves tensors out of
them (blocks); a freed tensor's block stays cached in its segment. The API layer sees
only the segments; the tensors, and the Python stacks that made them, are only in the
snapshot.

Python frames are not machine frames (no instruction pointer, a line number instead),
so they have their own table, `allocator_frames`, shaped like `stacks`: one stack id
per distinct list of frames, one row per frame, innermost first.
"""

from __future__ import annotations

from gputrace.schema import model
from gputrace.schema.enums import ALLOCATOR_ACTIONS, BLOCK_STATES
from gputrace.schema.model import BOOL, I16, I32, I64, STR, U32, U64, Column, Table, enum_columns

_PID = Column("pid", I32, "",
              "process the snapshot was taken in: the recorded process it was joined to "
              "(`import --into`), null for a snapshot imported on its own")
_DEVICE = Column("device", I16, "", "CUDA device index in the snapshot's process", False)
_STACK = Column("stack_id", I64, "",
                "key into allocator_frames; null when the snapshot holds no frames for it")

ALLOCATOR_SEGMENTS = Table(
    "allocator_segments",
    "Segments of PyTorch's caching allocator when the snapshot was taken: device memory "
    "it holds (reserved), each one allocation from CUDA.",
    "allocator",
    (
        _PID,
        _DEVICE,
        Column("address", U64, "address", "device address of the segment", False),
        Column("total_size_bytes", U64, "bytes", "reserved: the segment's size", False),
        Column("allocated_size_bytes", U64, "bytes",
               "bytes in blocks held by tensors (active_allocated)", False),
        Column("active_size_bytes", U64, "bytes",
               "bytes in active blocks (allocated or pending free)", False),
        Column("requested_size_bytes", U64, "bytes",
               "bytes the program asked for in its active blocks (before rounding); null "
               "when the snapshot's format lacks it (PyTorch 2.0)"),
        Column("stream", U64, "", "CUDA stream the segment is cached for"),
        Column("pool", STR, "",
               "`large` or `small` (blocks up to 1 MiB come from 2 MiB small segments)", False),
        Column("pool_id", STR, "",
               "memory pool id as `a,b`; `0,0` is the default pool (others: CUDA graphs, "
               "torch.cuda.MemPool)"),
        Column("is_expandable", BOOL, "", "an expandable segment (grown by mapping pages)"),
        _STACK,
        Column("api_alloc_ts_ns", I64, "ns",
               "time of the API layer's cuMemAlloc* call that returned this address "
               "(`import --into`); null when not joined"),
    ),
)

ALLOCATOR_BLOCKS = Table(
    "allocator_blocks",
    "Blocks of the caching allocator's segments when the snapshot was taken, in address "
    "order: tensors (active) and cached free space (inactive).",
    "allocator",
    (
        _PID,
        _DEVICE,
        Column("segment_address", U64, "address", "address of the segment holding it", False),
        Column("address", U64, "address", "device address of the block", False),
        Column("size_bytes", U64, "bytes", "block size (rounded by the allocator)", False),
        Column("requested_size_bytes", U64, "bytes",
               "bytes the program asked for (the last request, for an inactive block); "
               "null when the snapshot's format lacks it"),
        *enum_columns("state", BLOCK_STATES, "block state"),
        _STACK,
    ),
)

ALLOCATOR_EVENTS = Table(
    "allocator_events",
    "The caching allocator's trace entries (memory history), in the order it recorded "
    "them; only the last `max_entries` survive in a snapshot.",
    "allocator",
    (
        Column("ts_ns", I64, "ns",
               "time of the entry: CLOCK_MONOTONIC of the recording it was joined to, else "
               "Unix-epoch ns (manifest `clock`); docs/importers.md; null when the "
               "snapshot has no times (PyTorch 2.1 and older)"),
        Column("time_us", I64, "us", "the entry's own time stamp, as in the snapshot; null "
               "when its format has none"),
        Column("seq", U32, "", "position in the device's trace, 0 = oldest", False),
        _PID,
        _DEVICE,
        *enum_columns("action", ALLOCATOR_ACTIONS, "trace entry action"),
        Column("address", U64, "address",
               "block or segment address (null for oom entries)"),
        Column("size_bytes", U64, "bytes", "block or segment size; requested size for oom"),
        Column("device_free_bytes", U64, "bytes",
               "free device memory CUDA reported (oom entries only)"),
        Column("stream", U64, "", "CUDA stream"),
        _STACK,
        Column("compile_context", STR, "", "torch.compile context, when recorded"),
        Column("user_metadata", STR, "", "user metadata attached to the entry, when any"),
    ),
)

ALLOCATOR_FRAMES = Table(
    "allocator_frames",
    "Python (and C++) frames of the allocator's stacks, one row per frame, innermost "
    "first; one stack_id per distinct list of frames.",
    "allocator",
    (
        Column("stack_id", I64, "", "stack id referenced by the allocator tables", False),
        Column("depth", U32, "", "frame index, 0 = innermost", False),
        Column("function", STR, "", "function name as in the snapshot"),
        Column("filename", STR, "", "source file"),
        Column("line", I32, "", "line number"),
    ),
)

CATALOG = model.Catalog(
    ("allocator",),
    (ALLOCATOR_SEGMENTS, ALLOCATOR_BLOCKS, ALLOCATOR_EVENTS, ALLOCATOR_FRAMES))
"""This module's layers and tables, in catalog order (`schema.CATALOG_MODULES`)."""
