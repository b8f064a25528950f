"""Every table of a gputrace trace directory, column by column.

This module is the single source of truth for what a trace holds: the writer
validates record batches against it, `open_trace` types empty tables from it,
and `docs/trace-format.md` is generated from it (a test keeps them in step).

Conventions: snake_case names with the unit in the name (`ts_ns`,
`size_bytes`); timestamps are CLOCK_MONOTONIC nanoseconds (the manifest holds
the offset to wall-clock time); enumerations are stored twice, as a small
integer code and as its readable name (Parquet dictionary-encodes the name, so
it costs almost nothing on disk).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl
import pyarrow as pa

SCHEMA_VERSION = 1
"""Bumped whenever a column is added, removed, renamed or retyped."""


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    unit: str
    doc: str
    nullable: bool = True


@dataclass(frozen=True)
class Table:
    name: str
    doc: str
    layer: str
    columns: tuple[Column, ...]

    @property
    def arrow_schema(self) -> pa.Schema:
        return pa.schema(
            [pa.field(c.name, c.type, nullable=c.nullable) for c in self.columns],
            metadata={b"gputrace.schema_version": str(SCHEMA_VERSION).encode()},
        )

    @property
    def polars_schema(self) -> pl.Schema:
        empty = pl.from_arrow(self.arrow_schema.empty_table())
        assert isinstance(empty, pl.DataFrame)
        return empty.schema

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(name)


# ---------------------------------------------------------------- enumerations
# Codes are what the BPF programs emit; names are what users read.

DEVICE_KINDS: dict[int, str] = {0: "unknown", 1: "ctl", 2: "gpu", 3: "uvm", 4: "uvm-tools"}
MAPPING_OPS: dict[int, str] = {1: "mmap", 2: "munmap"}
FD_OPS: dict[int, str] = {1: "open", 2: "close", 3: "dup", 4: "seen"}
FAULT_SOURCES: dict[int, str] = {
    1: "cpu",
    2: "gpu_replayable",
    3: "gpu_non_replayable",
    4: "access_counter",
}
# uvm_fault_access_type_t (nvidia-driver-facts.md §3.3); CPU faults use READ/WRITE.
ACCESS_TYPES: dict[int, str] = {
    0: "prefetch",
    1: "read",
    2: "write",
    3: "atomic_weak",
    4: "atomic_strong",
}
# uvm_fault_type_t (nvidia-driver-facts.md §3.3); 255 = not known (CPU faults).
FAULT_TYPES: dict[int, str] = {
    0: "invalid_pde",
    1: "invalid_pte",
    2: "atomic",
    3: "write",
    4: "read",
    5: "fatal_pde_size",
    6: "va_limit_violation",
    7: "unbound_inst_block",
    8: "priv_violation",
    9: "pitch_mask_violation",
    10: "work_creation",
    11: "unsupported_aperture",
    12: "compression_failure",
    13: "unsupported_kind",
    14: "region_violation",
    15: "poisoned",
    16: "cc_violation",
    255: "unknown",
}
MIGRATION_CAUSES: dict[int, str] = {
    0: "unknown",
    1: "replayable_fault",
    2: "non_replayable_fault",
    3: "access_counter",
    4: "prefetch",
    5: "eviction",
    6: "api_tools",
    7: "api_migrate",
    8: "api_set_range_group",
    9: "api_hint",
}
CHUNK_OPS: dict[int, str] = {1: "alloc", 2: "free", 3: "split", 4: "merge", 5: "evict"}
CHUNK_MEM_TYPES: dict[int, str] = {0: "user", 1: "kernel"}

ENUMS: dict[str, dict[int, str]] = {
    "device": DEVICE_KINDS,
    "op": MAPPING_OPS,
    "fd_op": FD_OPS,
    "source": FAULT_SOURCES,
    "access_type": ACCESS_TYPES,
    "fault_type": FAULT_TYPES,
    "cause": MIGRATION_CAUSES,
    "chunk_op": CHUNK_OPS,
    "mem_type": CHUNK_MEM_TYPES,
}

# ------------------------------------------------------------------- columns

I8, I16, I32, I64 = pa.int8(), pa.int16(), pa.int32(), pa.int64()
U8, U16, U32, U64 = pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()
STR, BOOL = pa.string(), pa.bool_()


def _who(with_tid: bool = True) -> tuple[Column, ...]:
    cols = [
        Column("ts_ns", I64, "ns", "CLOCK_MONOTONIC time of the event (entry, for calls)", False),
        Column("pid", I32, "", "process id (tgid)", False),
    ]
    if with_tid:
        cols.append(Column("tid", I32, "", "thread id", False))
    cols.append(Column("comm", STR, "", "thread name at the time of the event"))
    return tuple(cols)


def _enum(name: str, values: dict[int, str], doc: str) -> tuple[Column, ...]:
    listing = ", ".join(f"{k}={v}" for k, v in sorted(values.items()))
    return (
        Column(f"{name}_code", U8, "enum", f"{doc}: code ({listing})", False),
        Column(name, STR, "enum", f"{doc}: name", False),
    )


PROCESSES = Table(
    "processes",
    "One row per process instance seen touching NVIDIA devices (or traced as a target).",
    "syscall",
    (
        Column("pid", I32, "", "process id (tgid)", False),
        Column("ppid", I32, "", "parent process id"),
        Column("comm", STR, "", "process name"),
        Column("exe", STR, "", "path of the executable"),
        Column("cmdline", STR, "", "command line, arguments joined by spaces"),
        Column("cgroup", STR, "", "cgroup v2 path"),
        Column("container_id", STR, "", "container id parsed from the cgroup, when there is one"),
        Column("start_ts_ns", I64, "ns", "process start (null when it predates the trace)"),
        Column("exit_ts_ns", I64, "ns", "process exit (null when it outlived the trace)"),
        Column("exit_code", I32, "", "exit status as wait(2) reports it"),
    ),
)

IOCTLS = Table(
    "ioctls",
    "Every ioctl on an NVIDIA device file, decoded at entry and exit.",
    "syscall",
    (
        *_who(),
        *_enum("device", DEVICE_KINDS, "device file kind"),
        Column("gpu_index", I16, "",
               "N of /dev/nvidiaN; for RM_ALLOC of a device (0x80) its deviceId (the RM "
               "device instance); null otherwise"),
        Column("fd", I32, "", "file descriptor", False),
        Column("cmd", U32, "", "raw ioctl request number", False),
        Column("nr", U32, "", "RM escape number (_IOC_NR) or UVM command number", False),
        Column("name", STR, "", "decoded command, e.g. RM_ALLOC, RM_FREE, UVM_FREE", False),
        Column("ret", I64, "", "syscall return value (negative errno)"),
        Column("status", U32, "", "NV_STATUS from the parameters (0 = NV_OK; null when none)"),
        Column("latency_ns", I64, "ns", "time from syscall entry to exit"),
        Column("h_client", U32, "", "RM client handle"),
        Column("h_parent", U32, "", "RM parent handle (RM_ALLOC) or device handle"),
        Column("h_object", U32, "", "RM object handle (new, freed, or mapped hMemory)"),
        Column("h_class", U32, "", "RM class of an allocated object"),
        Column("size_bytes", U64, "bytes", "allocation or mapping size"),
        Column("va_base", U64, "address", "UVM/GPU virtual base address"),
        Column("va_length", U64, "bytes", "UVM/GPU virtual length"),
        Column("offset", U64, "bytes", "offset (RM map offset, alloc OUT offset)"),
        Column("alignment", U64, "bytes", "requested alignment of a memory allocation"),
        Column("flags", U32, "", "command flags (NVOS32 alloc flags, map flags, UVM flags)"),
        Column("attr", U32, "", "NVOS32 attr of a memory allocation"),
        Column("attr2", U32, "", "NVOS32 attr2 of a memory allocation"),
        Column("ctrl_cmd", U32, "",
               "RM_CONTROL command; for RM_VID_HEAP_CONTROL the NVOS32 function (2 alloc, 3 free)"),
        Column("ref_fd", I32, "", "fd named inside the parameters (rmCtrlFd, uvmFd, map fd)"),
        Column("gpu_uuid", STR, "", "GPU UUID named by a UVM command, GPU-xxxxxxxx-... form"),
    ),
)

FILES = Table(
    "files",
    "Opens, duplications and closes of NVIDIA device fds (the RM frees a control "
    "fd's clients when its last reference closes).",
    "syscall",
    (
        *_who(),
        *_enum("fd_op", FD_OPS, "what happened (seen = already open when recording began)"),
        *_enum("device", DEVICE_KINDS, "device file kind"),
        Column("gpu_index", I16, "", "N of /dev/nvidiaN (null for other devices)"),
        Column("fd", I32, "", "the fd opened, duplicated from, or closed", False),
        Column("new_fd", I32, "", "the new fd of a dup (null otherwise)"),
        Column("ret", I64, "", "syscall return value (negative errno)"),
    ),
)

MAPPINGS = Table(
    "mappings",
    "mmap and munmap of NVIDIA device files (managed ranges, RM mappings).",
    "syscall",
    (
        *_who(),
        *_enum("op", MAPPING_OPS, "operation"),
        *_enum("device", DEVICE_KINDS, "device file kind (munmap: of the range's mmap)"),
        Column("gpu_index", I16, "", "N of /dev/nvidiaN (null for other devices)"),
        Column("fd", I32, "", "file descriptor (-1 for munmap)"),
        Column("addr", U64, "address", "start address: mmap result, or munmap argument"),
        Column("length", U64, "bytes", "length of the range", False),
        Column("offset", U64, "bytes", "file offset of an mmap"),
        Column("prot", U32, "", "PROT_* bits"),
        Column("flags", U32, "", "MAP_* bits"),
        Column("ret", I64, "", "syscall return (mmap: address or negative errno)"),
        Column("managed", BOOL, "", "mmap of the uvm fd with offset == address: a managed range"),
        Column("latency_ns", I64, "ns", "time from syscall entry to exit"),
    ),
)

CUDA_CALLS = Table(
    "cuda_calls",
    "CUDA driver API memory calls (uprobes on libcuda).",
    "api",
    (
        *_who(),
        Column("func", STR, "", "libcuda symbol, e.g. cuMemAlloc_v2", False),
        Column("size_bytes", U64, "bytes", "requested size"),
        Column("ptr", U64, "address", "device pointer returned (allocs) or passed (frees)"),
        Column("handle", U64, "", "CUmemGenericAllocationHandle or pool handle"),
        Column("flags", U64, "", "flags argument"),
        Column("stream", U64, "", "CUstream argument of async calls"),
        Column("result", I32, "", "CUresult returned (0 = CUDA_SUCCESS)"),
        Column("latency_ns", I64, "ns", "time from call to return"),
        Column("stack_id", I64, "", "key into the stacks table (with pid); null when none"),
    ),
)

STACKS = Table(
    "stacks",
    "Symbolized user call stacks, one row per frame, innermost first.",
    "api",
    (
        Column("pid", I32, "", "process whose address space the addresses belong to", False),
        Column("stack_id", I64, "", "stack id referenced by cuda_calls.stack_id", False),
        Column("depth", U16, "", "frame index, 0 = innermost", False),
        Column("ip", U64, "address", "instruction pointer", False),
        Column("module", STR, "", "path of the mapped object holding ip (null if unknown)"),
        Column("offset", U64, "bytes", "ip relative to the module's load base"),
        Column("symbol", STR, "", "function name (null when it could not be resolved)"),
    ),
)

FAULTS = Table(
    "faults",
    "Page faults on managed memory: CPU faults (tracepoint) and GPU faults (driver).",
    "driver",
    (
        Column("ts_ns", I64, "ns", "CLOCK_MONOTONIC time the fault was seen", False),
        Column("pid", I32, "", "faulting process (null when the driver could not tell)"),
        Column("tid", I32, "", "faulting thread (CPU faults)"),
        Column("comm", STR, "", "thread name"),
        *_enum("source", FAULT_SOURCES, "who faulted"),
        Column("gpu_index", I16, "", "faulting GPU (null for CPU faults)"),
        Column("address", U64, "address", "faulting virtual address", False),
        Column("block_2m", U64, "address", "address rounded down to its 2 MiB VA block", False),
        *_enum("fault_type", FAULT_TYPES, "uvm_fault_type_t"),
        *_enum("access_type", ACCESS_TYPES, "access kind"),
        Column("instances", U16, "", "duplicate faults coalesced into this one (GPU)"),
        Column("batch_id", U32, "", "fault batch (GPU replayable faults)"),
        Column("ip", U64, "address", "instruction pointer (CPU faults)"),
    ),
)

FAULT_BATCHES = Table(
    "fault_batches",
    "GPU replayable fault batches as serviced by nvidia-uvm.",
    "driver",
    (
        Column("ts_ns", I64, "ns", "start of servicing", False),
        Column("gpu_index", I16, "", "GPU", False),
        Column("batch_id", U32, "", "batch id", False),
        Column("faults", U32, "", "fault entries fetched"),
        Column("duplicates", U32, "", "duplicate faults in the batch"),
        Column("duration_ns", I64, "ns", "service time"),
    ),
)

MIGRATIONS = Table(
    "migrations",
    "Page migrations between processors (0 = CPU, n = GPU n-1) with their cause.",
    "driver",
    (
        Column("ts_ns", I64, "ns", "start of the copy", False),
        Column("pid", I32, "", "owning process, when known"),
        Column("src", I16, "", "source processor id (0 = CPU, n = GPU n-1)", False),
        Column("dst", I16, "", "destination processor id", False),
        Column("address", U64, "address", "first virtual address migrated", False),
        Column("size_bytes", U64, "bytes", "bytes migrated", False),
        *_enum("cause", MIGRATION_CAUSES, "uvm_make_resident_cause_t"),
        Column("duration_ns", I64, "ns", "copy time"),
    ),
)

CHUNKS = Table(
    "chunks",
    "Physical memory manager (PMM) chunk events per GPU.",
    "driver",
    (
        Column("ts_ns", I64, "ns", "time of the event", False),
        Column("gpu_index", I16, "", "GPU", False),
        *_enum("chunk_op", CHUNK_OPS, "operation"),
        Column("address", U64, "address", "physical address of the chunk", False),
        Column("log2_size", U8, "log2 bytes", "chunk size as a power of two", False),
        *_enum("mem_type", CHUNK_MEM_TYPES, "PMM memory type"),
        Column("pid", I32, "", "process on whose behalf, when known"),
    ),
)

TABLES: dict[str, Table] = {
    t.name: t
    for t in (
        PROCESSES,
        IOCTLS,
        FILES,
        MAPPINGS,
        CUDA_CALLS,
        STACKS,
        FAULTS,
        FAULT_BATCHES,
        MIGRATIONS,
        CHUNKS,
    )
}

LAYERS: dict[str, tuple[str, ...]] = {
    layer: tuple(t.name for t in TABLES.values() if t.layer == layer)
    for layer in ("syscall", "api", "driver")
}


def table(name: str) -> Table:
    """Look a table up by name; unknown names raise `KeyError`."""
    return TABLES[name]


def render_markdown() -> str:
    """The text of docs/trace-format.md, generated from the tables above."""
    out = [
        "# Trace format",
        "",
        "<!-- generated by `python -m gputrace.schema > docs/trace-format.md`; "
        "tests/test_schema.py fails when it is stale -->",
        "",
        f"Schema version **{SCHEMA_VERSION}**. A trace is a directory:",
        "",
        "```",
        "<trace>/manifest.json",
        "<trace>/<table>/part-000001.parquet ...",
        "```",
        "",
        "Timestamps are CLOCK_MONOTONIC nanoseconds; `manifest.clock.realtime_offset_ns` "
        "added to them gives Unix-epoch nanoseconds. Each Parquet part carries "
        "`gputrace.schema_version` in its key-value metadata. A table with no parts "
        "scans as an empty frame of the types below.",
        "",
    ]
    for t in TABLES.values():
        out += [f"## `{t.name}` ({t.layer} layer)", "", t.doc, ""]
        out += ["| column | type | unit | null | meaning |", "|---|---|---|---|---|"]
        for c in t.columns:
            null = "yes" if c.nullable else "no"
            out.append(f"| `{c.name}` | {c.type} | {c.unit} | {null} | {c.doc} |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(render_markdown(), end="")
