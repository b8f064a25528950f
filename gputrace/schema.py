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
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    import polars as pl

SCHEMA_VERSION = 2
# The trace directory's own format (manifest layout, part naming), versioned apart from
# the tables' columns.
FORMAT_NAME = "gputrace-trace"
FORMAT_VERSION = 1
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
    other_layers: tuple[str, ...] = ()
    """Further layers whose recorders also write rows into this table."""

    @property
    def layers(self) -> tuple[str, ...]:
        return (self.layer, *self.other_layers)

    @property
    def arrow_schema(self) -> pa.Schema:
        return pa.schema(
            [pa.field(c.name, c.type, nullable=c.nullable) for c in self.columns],
            metadata={b"gputrace.schema_version": str(SCHEMA_VERSION).encode()},
        )

    @property
    def polars_schema(self) -> pl.Schema:
        import polars as pl  # lazily: the recorder never needs polars

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
    0: "unknown",
    1: "cpu",
    2: "gpu_replayable",
    3: "gpu_non_replayable",
    4: "access_counter",
}
# uvm_fault_access_type_t (nvidia-driver-facts.md §3.3); CPU faults use READ/WRITE.
# 5 and 255 exist for the UVM tools stream, whose access types say "atomic" without
# weak/strong and may be invalid (TOOLS_ACCESS_TYPES below).
ACCESS_TYPES: dict[int, str] = {
    0: "prefetch",
    1: "read",
    2: "write",
    3: "atomic_weak",
    4: "atomic_strong",
    5: "atomic",
    255: "unknown",
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
    10: "user",
    11: "coherence",
}
"""uvm_make_resident_cause_t (0-9); 10 and 11 are the UVM tools stream's coarser
causes (UvmEventMigrationCauseUser, ...Coherence), which merge several of 1-9."""
CHUNK_OPS: dict[int, str] = {1: "alloc", 2: "free", 3: "split", 4: "merge", 5: "evict"}
CHUNK_MEM_TYPES: dict[int, str] = {0: "user", 1: "kernel"}
UVM_EVENT_KINDS: dict[int, str] = {
    6: "fatal_fault",
    7: "read_duplicate",
    8: "read_duplicate_invalidate",
    10: "thrashing",
    11: "throttling_start",
    12: "throttling_end",
    13: "map_remote",
}
"""Codes are the UVM tools UvmEventType values (nvidia-driver-facts.md §5.1)."""
UVM_EVENT_REASONS: dict[int, str] = {
    0: "unknown",
    1: "invalid_address",
    2: "invalid_permissions",
    3: "invalid_fault_type",
    4: "out_of_memory",
    5: "internal_error",
    6: "invalid_operation",
    7: "coherence",
    8: "thrashing",
    9: "policy",
    10: "eviction",
}
"""Why a fatal fault was fatal (UvmEventFatalReason, 1-6) or why a range was mapped
remotely (UvmEventMapRemoteCause: coherence, thrashing, policy, out_of_memory,
eviction)."""
UVM_COUNTERS: dict[int, str] = {
    0: "bytes_htod",
    1: "bytes_dtoh",
    2: "cpu_faults",
    7: "prefetch_bytes_htod",
    8: "prefetch_bytes_dtoh",
    9: "gpu_faults",
}
"""UvmCounterName (3-6 are Windows-only and never reported on Linux)."""

# ------------------------------------------------ UVM tools enums -> ours
# The tools ABI numbers its enums differently from the driver's internal ones
# that the tables use; this is the one mapping table (tools value -> our code).
TOOLS_FAULT_TYPES: dict[int, int] = {0: 255, 1: 0, 2: 1, 3: 3, 4: 2,
                                     **{v: v for v in range(5, 17)}}
"""UvmEventFaultType -> FAULT_TYPES (invalid -> unknown; PDE/PTE and write/atomic swap)."""
TOOLS_ACCESS_TYPES: dict[int, int] = {0: 255, 1: 1, 2: 2, 3: 5, 4: 0}
"""UvmEventMemoryAccessType -> ACCESS_TYPES."""
TOOLS_CLIENT_TYPES: dict[int, int] = {0: 0, 1: 2, 2: 3}
"""UvmEventFaultClientType -> FAULT_SOURCES (GPC = replayable, HUB = non-replayable)."""
TOOLS_MIGRATION_CAUSES: dict[int, int] = {0: 0, 1: 10, 2: 11, 3: 4, 4: 5, 5: 3}
"""UvmEventMigrationCause -> MIGRATION_CAUSES."""
TOOLS_FATAL_REASONS: dict[int, int] = {v: v for v in range(7)}
"""UvmEventFatalReason -> UVM_EVENT_REASONS."""
TOOLS_MAP_REMOTE_CAUSES: dict[int, int] = {0: 0, 1: 7, 2: 8, 3: 9, 4: 4, 5: 10}
"""UvmEventMapRemoteCause -> UVM_EVENT_REASONS."""

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
    "kind": UVM_EVENT_KINDS,
    "reason": UVM_EVENT_REASONS,
    "counter": UVM_COUNTERS,
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


def _enum(name: str, values: dict[int, str], doc: str,
          nullable: bool = False) -> tuple[Column, ...]:
    listing = ", ".join(f"{k}={v}" for k, v in sorted(values.items()))
    return (
        Column(f"{name}_code", U8, "enum", f"{doc}: code ({listing})", nullable),
        Column(name, STR, "enum", f"{doc}: name", nullable),
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
    "Page faults on managed memory: CPU faults (layer `cpu_faults`: a kernel tracepoint; "
    "or layer `uvm_tools`: the driver's CPU fault events) and GPU faults (layer "
    "`uvm_tools`: the driver's GPU fault events). A recording takes a process's CPU "
    "faults from one of the two sources, never both.",
    "driver",
    (
        Column("ts_ns", I64, "ns",
               "CLOCK_MONOTONIC time the fault was seen (GPU faults: when the driver "
               "started servicing it)", False),
        Column("pid", I32, "", "faulting process (null when the driver could not tell)"),
        Column("tid", I32, "", "faulting thread (CPU faults)"),
        Column("comm", STR, "", "thread name"),
        *_enum("source", FAULT_SOURCES,
               "who faulted (GPU: replayable = GPC client, non-replayable = HUB client)"),
        Column("gpu_index", I16, "", "faulting GPU, trace GPU index (null for CPU faults)"),
        Column("address", U64, "address", "faulting virtual address", False),
        Column("block_2m", U64, "address", "address rounded down to its 2 MiB VA block", False),
        *_enum("fault_type", FAULT_TYPES,
               "uvm_fault_type_t (tools UvmEventFaultType mapped by TOOLS_FAULT_TYPES)"),
        *_enum("access_type", ACCESS_TYPES, "access kind"),
        Column("instances", U16, "", "duplicate faults coalesced into this one (GPU)"),
        Column("batch_id", U32, "", "fault batch (GPU faults; per GPU and source)"),
        Column("ip", U64, "address", "instruction pointer (CPU faults)"),
        Column("ts_gpu_ns", U64, "ns",
               "GPU global timer when the GPU wrote the fault entry (GPU faults)"),
        Column("gpc_id", U16, "", "physical GPC that faulted (replayable GPU faults)"),
        Column("channel_id", U16, "",
               "channel of the faulting work (non-replayable GPU faults)"),
        Column("client_id", U16, "", "MMU client id, architecture-specific (GPU faults)"),
        Column("cpu_id", U32, "",
               "CPU the faulting thread ran on (uvm_tools CPU faults, drivers >= 565.57.01)"),
    ),
    ("cpu_faults", "uvm_tools"),
)

FAULT_BATCHES = Table(
    "fault_batches",
    "GPU fault batches: the faults serviced together before one replay (replayable) "
    "or channel reschedule (non-replayable).",
    "driver",
    (
        Column("ts_ns", I64, "ns", "start of servicing: CPU time of the batch's first fault",
               False),
        Column("pid", I32, "", "process whose faults these are (one tracker per process)"),
        Column("gpu_index", I16, "", "GPU, trace GPU index (null when its processor index "
               "was not in the processor table)"),
        Column("batch_id", U32, "", "batch id (unique per GPU and source)", False),
        *_enum("source", FAULT_SOURCES, "gpu_replayable or gpu_non_replayable", True),
        Column("faults", U32, "", "fault entries in the batch"),
        Column("duplicates", U32, "",
               "faults repeating an earlier fault of the same batch (same address and "
               "access type)"),
        Column("duration_ns", I64, "ns",
               "service time: first fault's CPU time to the replay's (null when the "
               "replay was not seen)"),
        Column("replay_ts_gpu_ns", U64, "ns", "GPU global timer when the replay finished"),
    ),
    ("uvm_tools",),
)

MIGRATIONS = Table(
    "migrations",
    "Page migrations between processors with their cause. Processors are trace GPU "
    "indices, with -1 for the CPU.",
    "driver",
    (
        Column("ts_ns", I64, "ns", "start of the copy (CPU time it was queued)", False),
        Column("pid", I32, "", "owning process, when known"),
        Column("src", I16, "", "source processor: trace GPU index, -1 = CPU", False),
        Column("dst", I16, "", "destination processor: trace GPU index, -1 = CPU", False),
        Column("address", U64, "address", "first virtual address migrated", False),
        Column("size_bytes", U64, "bytes", "bytes migrated", False),
        *_enum("cause", MIGRATION_CAUSES,
               "uvm_make_resident_cause_t (tools causes mapped by TOOLS_MIGRATION_CAUSES)"),
        Column("duration_ns", I64, "ns",
               "copy time on the CPU clock (null for asynchronous copies)"),
        Column("ts_gpu_ns", U64, "ns", "GPU global timer when the copy started"),
        Column("duration_gpu_ns", I64, "ns", "copy time on the GPU timer"),
        Column("src_nid", I32, "", "source CPU NUMA node (tools V2 records; else null)"),
        Column("dst_nid", I32, "", "destination CPU NUMA node (tools V2 records; else null)"),
    ),
    ("uvm_tools",),
)

UVM_EVENTS = Table(
    "uvm_events",
    "The UVM driver's heuristics and errors, one row per tools event: thrashing "
    "detected, throttling start/end, remote mappings, read duplication and its "
    "invalidation, fatal faults.",
    "uvm_tools",
    (
        Column("ts_ns", I64, "ns", "CLOCK_MONOTONIC time of the event", False),
        Column("pid", I32, "", "process whose address space the event is in", False),
        *_enum("kind", UVM_EVENT_KINDS, "event type"),
        Column("processor", I16, "",
               "processor the event is about (trace GPU index, -1 = CPU): the throttled "
               "one, the faulting one, the one being mapped remotely; for "
               "read_duplicate_invalidate the one now holding the only copy"),
        Column("residency", I16, "",
               "map_remote: processor whose memory holds the data (trace GPU index, -1 = CPU)"),
        Column("processors", STR, "",
               "thrashing and read_duplicate: processors involved, trace GPU indices "
               "(-1 = CPU) joined by commas"),
        Column("address", U64, "address", "virtual address of the region or fault", False),
        Column("size_bytes", U64, "bytes", "size of the region (null for faults, throttling)"),
        *_enum("reason", UVM_EVENT_REASONS,
               "fatal_fault: why fatal; map_remote: why remote (null otherwise)", True),
        *_enum("fault_type", FAULT_TYPES, "fatal_fault: fault type (null otherwise)", True),
        *_enum("access_type", ACCESS_TYPES, "fatal_fault: access kind (null otherwise)", True),
        Column("ts_gpu_ns", U64, "ns", "map_remote: GPU timer when the mapping took effect"),
    ),
)

UVM_COUNTERS_TABLE = Table(
    "uvm_counters",
    "The UVM driver's per-process counters, sampled over time (cumulative since the "
    "counter tracker attached).",
    "uvm_tools",
    (
        Column("ts_ns", I64, "ns", "CLOCK_MONOTONIC time of the sample", False),
        Column("pid", I32, "", "process", False),
        *_enum("counter", UVM_COUNTERS, "UvmCounterName"),
        Column("value", U64, "", "counter value (bytes or faults, per the name)", False),
    ),
)

GPU_MEMORY = Table(
    "gpu_memory",
    "Physical GPU memory sampled from RM (NV2080_CTRL_CMD_FB_GET_INFO_V2): heap size, "
    "free memory and the largest free region, i.e. the largest single allocation "
    "that can still succeed.",
    "rm_query",
    (
        Column("ts_ns", I64, "ns", "CLOCK_MONOTONIC time of the sample", False),
        Column("gpu_index", I16, "", "GPU, trace GPU index", False),
        Column("heap_size_bytes", U64, "bytes", "RM heap size (HEAP_SIZE)"),
        Column("heap_free_bytes", U64, "bytes", "free heap (HEAP_FREE)"),
        Column("largest_free_bytes", U64, "bytes",
               "largest free region (LARGEST_FREE_REGION_SIZE)"),
        Column("largest_free_base_bytes", U64, "bytes",
               "offset of the largest free region in the heap (LARGEST_FREE_REGION_BASE)"),
        Column("status", U32, "",
               "RM status of the query (0 = NV_OK; other values leave the sizes null)", False),
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

ALERTS = Table(
    "alerts",
    "Alerts that fired while recording (`record --alert EXPR`): one row per condition "
    "episode, when it began (docs/live.md).",
    "live",
    (
        Column("ts_ns", I64, "ns", "CLOCK_MONOTONIC time the alert fired", False),
        Column("alert", STR, "", "what was measured, e.g. leak_rate, gpu_free, drops", False),
        Column("expr", STR, "", "the --alert expression as given", False),
        Column("pid", I32, "", "process the alert is about (null for GPU and recording alerts)"),
        Column("comm", STR, "", "that process's name"),
        Column("gpu_index", I16, "", "GPU the alert is about (null for process alerts)"),
        Column("value", pa.float64(), "",
               "measured value in base units (bytes, bytes/s, events/s, share, count)", False),
        Column("threshold", pa.float64(), "", "the expression's threshold, in the same units",
               False),
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
        UVM_EVENTS,
        UVM_COUNTERS_TABLE,
        GPU_MEMORY,
        ALERTS,
    )
}

LAYERS: dict[str, tuple[str, ...]] = {
    layer: tuple(t.name for t in TABLES.values() if layer in t.layers)
    for layer in ("syscall", "api", "cpu_faults", "driver", "uvm_tools", "rm_query", "live")
}
"""Tables each layer writes. `driver` is in-kernel driver hooks (PMM chunks, fault
batches); `uvm_tools` is the driver's own UVM tools event stream and counters
(no kernel hooks); `rm_query` is RM queries of our own client (GPU memory); `live` is
what the recorder concluded while recording (alerts)."""


MANIFEST_FIELDS: tuple[tuple[str, str], ...] = (
    ("format, format_version, schema_version, gputrace_version",
     "what wrote the trace and in which format"),
    ("status", "`recording` until the recorder finished, then `complete`"),
    ("layers", "layers recorded (see LAYERS: syscall, api, cpu_faults, driver, uvm_tools, "
     "rm_query); a table of a layer not listed is unknown, not empty"),
    ("start_ts_ns, end_ts_ns", "CLOCK_MONOTONIC span of the recording"),
    ("clock.realtime_offset_ns", "added to a timestamp gives Unix-epoch nanoseconds"),
    ("clock.uvm_events",
     "clock of the uvm_tools rows as recorded: \"CLOCK_MONOTONIC_RAW converted to "
     "CLOCK_MONOTONIC with offsets measured at start and during recording\" (the driver "
     "stamps its events with CLOCK_MONOTONIC_RAW)"),
    ("drops", "events lost per ring buffer or queue, e.g. `proc_events`; UVM tools queues "
     "per event type as `uvm_tools:<type>` (`uvm_tools:gpu_fault`, `uvm_tools:migration`, "
     "...), from the queues' dropped counters"),
    ("driver_layer.trackers_attached", "processes a UVM tools tracker was attached to"),
    ("driver_layer.attach_failures",
     "list of {pid, error} for processes whose tracker could not be attached"),
    ("driver_layer.missed_before_attach",
     "list of {pid, attached_ts_ns} for processes whose UVM activity before the tracker "
     "attached is missing (processes already running when recording began)"),
    ("driver_layer.sample_interval_ms", "period of the gpu_memory and uvm_counters samples"),
    ("gpus", "GPUs: index (the trace GPU index every table uses), memory_bytes, name, uuid"),
    ("synthetic", "true for traces built by gputrace.builder, never recorded"),
)
"""Manifest keys readers rely on, and what they mean (documented with the tables)."""


# ------------------------------------------------------------ fleet datasets
# `gputrace export` writes many traces as one dataset (docs/fleet.md): every table
# above plus these columns, which say which recording a row came from. `date` and
# `host` are hive partitions (`<table>/date=YYYY-MM-DD/host=NAME/<trace_id>.parquet`),
# so they live in the path; the others are stored in each file.
FLEET_COLUMNS: tuple[Column, ...] = (
    Column("host", STR, "", "hostname of the recording host (hive partition `host=`)", False),
    Column("trace_id", STR, "",
           "the recording's identity: manifest `trace_id`, else a hash of host, start "
           "time, creation time and recorder pid", False),
    Column("driver_version", STR, "", "NVIDIA driver version from the manifest"),
    Column("gpu_model", STR, "", "GPU names from the manifest, distinct, joined by ', '"),
    Column("date", STR, "",
           "UTC date the recording started, YYYY-MM-DD (hive partition `date=`)", False),
)
FLEET_PARTITIONS: tuple[str, ...] = ("date", "host")
"""Hive partition columns of a fleet dataset, outermost first."""


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
    out += ["## Manifest", "", "`manifest.json` holds facts about the recording:", "",
            "| key | meaning |", "|---|---|"]
    out += [f"| `{k}` | {v} |" for k, v in MANIFEST_FIELDS]
    out += ["", "## Layers", "", "| layer | tables |", "|---|---|"]
    out += [f"| `{k}` | {', '.join(f'`{n}`' for n in v)} |" for k, v in LAYERS.items()]
    out.append("")
    for t in TABLES.values():
        also = f", also {', '.join(t.other_layers)}" if t.other_layers else ""
        out += [f"## `{t.name}` ({t.layer} layer{also})", "", t.doc, ""]
        out += ["| column | type | unit | null | meaning |", "|---|---|---|---|---|"]
        for c in t.columns:
            null = "yes" if c.nullable else "no"
            out.append(f"| `{c.name}` | {c.type} | {c.unit} | {null} | {c.doc} |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(render_markdown(), end="")
