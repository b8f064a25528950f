"""Tables of the driver's evidence: faults, fault batches, migrations, UVM tools events
and counters (layer `uvm_tools`: the driver's own event stream), CPU faults (layer
`cpu_faults`), GPU memory samples and per-process GPU memory (layer `rm_query`: our
own RM client's queries)
and PMM chunk events (layer `driver`: in-kernel hooks, where a host allows them).
"""

from __future__ import annotations

from gputrace.schema import model
from gputrace.schema.enums import (
    ACCESS_TYPES,
    CHUNK_MEM_TYPES,
    CHUNK_OPS,
    FAULT_SOURCES,
    FAULT_TYPES,
    MIGRATION_CAUSES,
    UVM_COUNTERS,
    UVM_EVENT_KINDS,
    UVM_EVENT_REASONS,
)
from gputrace.schema.model import I16, I32, I64, STR, U8, U16, U32, U64, Column, Table, enum_columns

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
        *enum_columns("source", FAULT_SOURCES,
                      "who faulted (GPU: replayable = GPC client, non-replayable = HUB client)"),
        Column("gpu_index", I16, "", "faulting GPU, trace GPU index (null for CPU faults)"),
        Column("address", U64, "address", "faulting virtual address", False),
        Column("block_2m", U64, "address", "address rounded down to its 2 MiB VA block", False),
        *enum_columns("fault_type", FAULT_TYPES,
                      "uvm_fault_type_t (tools UvmEventFaultType mapped by TOOLS_FAULT_TYPES)"),
        *enum_columns("access_type", ACCESS_TYPES, "access kind"),
        Column("instances", U16, "", "duplicate faults coalesced into this one (GPU)"),
        Column("batch_id", U32, "", "fault batch (GPU faults; per GPU and source)"),
        Column("ip", U64, "address", "instruction pointer (CPU faults)"),
        Column("ts_gpu_ns", U64, "ns",
               "GPU global timer when the GPU wrote the fault entry (GPU faults)", since=2),
        Column("gpc_id", U16, "", "physical GPC that faulted (replayable GPU faults)", since=2),
        Column("channel_id", U16, "",
               "channel of the faulting work (non-replayable GPU faults)", since=2),
        Column("client_id", U16, "", "MMU client id, architecture-specific (GPU faults)", since=2),
        Column("cpu_id", U32, "",
               "CPU the faulting thread ran on (uvm_tools CPU faults, drivers >= 565.57.01)",
               since=2),
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
        Column("pid", I32, "", "process whose faults these are (one tracker per process)", since=2),
        Column("gpu_index", I16, "", "GPU, trace GPU index (null when its processor index "
               "was not in the processor table)"),
        Column("batch_id", U32, "", "batch id (unique per GPU and source)", False),
        *enum_columns("source", FAULT_SOURCES, "gpu_replayable or gpu_non_replayable", True,
                     since=2),
        Column("faults", U32, "", "fault entries in the batch"),
        Column("duplicates", U32, "",
               "faults repeating an earlier fault of the same batch (same address and "
               "access type)"),
        Column("duration_ns", I64, "ns",
               "service time: first fault's CPU time to the replay's (null when the "
               "replay was not seen)"),
        Column("replay_ts_gpu_ns", U64, "ns", "GPU global timer when the replay finished", since=2),
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
        *enum_columns("cause", MIGRATION_CAUSES,
                      "uvm_make_resident_cause_t (tools causes mapped by TOOLS_MIGRATION_CAUSES)"),
        Column("duration_ns", I64, "ns",
               "copy time on the CPU clock (null for asynchronous copies)"),
        Column("ts_gpu_ns", U64, "ns", "GPU global timer when the copy started", since=2),
        Column("duration_gpu_ns", I64, "ns", "copy time on the GPU timer", since=2),
        Column("src_nid", I32, "", "source CPU NUMA node (tools V2 records; else null)", since=2),
        Column("dst_nid", I32, "", "destination CPU NUMA node (tools V2 records; else null)",
               since=2),
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
        *enum_columns("kind", UVM_EVENT_KINDS, "event type"),
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
        *enum_columns("reason", UVM_EVENT_REASONS,
                      "fatal_fault: why fatal; map_remote: why remote (null otherwise)", True),
        *enum_columns("fault_type", FAULT_TYPES, "fatal_fault: fault type (null otherwise)", True),
        *enum_columns("access_type", ACCESS_TYPES, "fatal_fault: access kind (null otherwise)",
                      True),
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
        *enum_columns("counter", UVM_COUNTERS, "UvmCounterName"),
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
        Column("trigger", STR, "",
               "why the sample was taken: `tick` (the sampler's period) or `incident` (a "
               "\"no memory\" failure on this GPU; null in traces older than this column)",
               since=4),
        Column("delay_ns", I64, "ns",
               "incident samples: time from the failed call's return to this sample "
               "(null for ticks)", since=4),
    ),
)

GPU_PROCESS_MEMORY = Table(
    "gpu_process_memory",
    "GPU memory per process from the driver's own accounting, the way nvidia-smi lists "
    "processes: RM's NV2080_CTRL_CMD_GPU_GET_PIDS names the processes holding memory on "
    "a GPU and NV2080_CTRL_CMD_GPU_GET_PID_INFO their video memory, asked from the host's "
    "PID namespace. Every process counts, traced or not, including ones started before "
    "the recording.",
    "rm_query",
    (
        Column("ts_ns", I64, "ns", "CLOCK_MONOTONIC time of the query", False),
        Column("gpu_index", I16, "", "GPU, trace GPU index", False),
        Column("pid", I32, "", "process, host pid as the driver reports it", False),
        Column("vidmem_bytes", U64, "bytes",
               "video memory the driver attributes to the process (GET_PID_INFO index 0; "
               "null when the query failed)"),
        Column("trigger", STR, "",
               "why the query was made: `tick` (its own period) or `incident` (a \"no "
               "memory\" failure on this GPU)", False),
        Column("status", U32, "",
               "RM status of the query (0 = NV_OK; other values leave the bytes null)", False),
    ),
)

CHUNKS = Table(
    "chunks",
    "Physical memory manager (PMM) chunk events per GPU.",
    "driver",
    (
        Column("ts_ns", I64, "ns", "time of the event", False),
        Column("gpu_index", I16, "", "GPU", False),
        *enum_columns("chunk_op", CHUNK_OPS, "operation"),
        Column("address", U64, "address", "physical address of the chunk", False),
        Column("log2_size", U8, "log2 bytes", "chunk size as a power of two", False),
        *enum_columns("mem_type", CHUNK_MEM_TYPES, "PMM memory type"),
        Column("pid", I32, "", "process on whose behalf, when known"),
    ),
)

CATALOG = model.Catalog(
    ("cpu_faults", "driver", "uvm_tools", "rm_query"),
    (FAULTS, FAULT_BATCHES, MIGRATIONS, CHUNKS, UVM_EVENTS, UVM_COUNTERS_TABLE, GPU_MEMORY,
     GPU_PROCESS_MEMORY))
"""This module's layers and tables, in catalog order (`schema.CATALOG_MODULES`)."""
