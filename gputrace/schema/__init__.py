"""Every table of a gputrace trace directory, column by column: the catalog.

This package is the single source of truth for what a trace holds: the writer
validates record batches against it, `open_trace` types empty tables from it,
and `docs/trace-format.md` is generated from it (`python -m gputrace.schema`; a
test keeps them in step). Each fact is written once, in one module:

- `model`: `Column`, `Table`, the schema and format versions;
- `enums`: every enumeration (code -> name) and the UVM tools codes mapped to ours;
- `syscall`, `api`, `driver_evidence`, `live`, `allocator`: the tables, by the layer that
  writes them;
- here: the catalog (`TABLES`, `LAYERS`, `table()`, added up from each module's
  `CATALOG` in `CATALOG_MODULES` order), the manifest keys readers rely on, and the
  columns a fleet dataset adds.

Stages read the schema as one vocabulary, `schema.IOCTLS`, `schema.DEVICE_KINDS`,
`schema.SCHEMA_VERSION`: the catalog names the tables it lists, and the
enumerations and versions it is built with (`__all__`).
"""

from __future__ import annotations

import importlib

from gputrace.schema.allocator import (
    ALLOCATOR_BLOCKS,
    ALLOCATOR_EVENTS,
    ALLOCATOR_FRAMES,
    ALLOCATOR_SEGMENTS,
)
from gputrace.schema.api import CUDA_CALLS, STACKS
from gputrace.schema.driver_evidence import (
    CHUNKS,
    FAULT_BATCHES,
    FAULTS,
    GPU_MEMORY,
    GPU_PROCESS_MEMORY,
    MIGRATIONS,
    UVM_COUNTERS_TABLE,
    UVM_EVENTS,
)
from gputrace.schema.enums import (
    ACCESS_TYPES,
    ALLOCATOR_ACTIONS,
    BLOCK_STATES,
    CHUNK_MEM_TYPES,
    CHUNK_OPS,
    DEV_CTL,
    DEV_GPU,
    DEV_UVM,
    DEV_UVM_TOOLS,
    DEVICE_KINDS,
    ENUMS,
    FAULT_SOURCES,
    FAULT_TYPES,
    FD_OPS,
    MAPPING_OPS,
    MIGRATION_CAUSES,
    TOOLS_ACCESS_TYPES,
    TOOLS_CLIENT_TYPES,
    TOOLS_FATAL_REASONS,
    TOOLS_FAULT_TYPES,
    TOOLS_MAP_REMOTE_CAUSES,
    TOOLS_MIGRATION_CAUSES,
    UVM_COUNTERS,
    UVM_EVENT_KINDS,
    UVM_EVENT_REASONS,
)
from gputrace.schema.live import ALERTS
from gputrace.schema.model import (
    FORMAT_NAME,
    FORMAT_VERSION,
    STR,
    Catalog,
    Column,
    PartSet,
    Table,
    schema_version,
)
from gputrace.schema.syscall import (
    FILES,
    IDENTITY_COLUMNS,
    IOCTL_COMMANDS,
    IOCTLS,
    MAPPINGS,
    PROCESSES,
)

__all__ = [
    "ACCESS_TYPES", "ALERTS", "ALLOCATOR_ACTIONS", "ALLOCATOR_BLOCKS", "ALLOCATOR_EVENTS",
    "ALLOCATOR_FRAMES", "ALLOCATOR_SEGMENTS", "BLOCK_STATES", "CATALOG_MODULES", "CHUNKS",
    "CHUNK_MEM_TYPES", "CHUNK_OPS", "CUDA_CALLS", "DEVICE_KINDS", "DEV_CTL", "DEV_GPU",
    "DEV_UVM", "DEV_UVM_TOOLS", "ENUMS", "FAULTS", "FAULT_BATCHES", "FAULT_SOURCES",
    "FAULT_TYPES", "FD_OPS", "FILES", "FLEET_COLUMNS", "FLEET_PARTITIONS", "FORMAT_NAME",
    "FORMAT_VERSION", "GPU_MEMORY", "GPU_PROCESS_MEMORY", "IDENTITY_COLUMNS", "IOCTLS",
    "IOCTL_COMMANDS", "LAYERS", "MANIFEST_FIELDS", "MAPPINGS", "MAPPING_OPS", "MIGRATIONS",
    "MIGRATION_CAUSES", "PROCESSES", "SCHEMA_VERSION", "STACKS", "TABLES", "TOOLS_ACCESS_TYPES",
    "TOOLS_CLIENT_TYPES", "TOOLS_FATAL_REASONS", "TOOLS_FAULT_TYPES", "TOOLS_MAP_REMOTE_CAUSES",
    "TOOLS_MIGRATION_CAUSES", "UVM_COUNTERS", "UVM_COUNTERS_TABLE", "UVM_EVENTS",
    "UVM_EVENT_KINDS", "UVM_EVENT_REASONS", "Catalog", "Column", "PartSet", "Table", "add",
    "remove", "table",
]  # fmt: skip

CATALOG_MODULES: tuple[str, ...] = ("syscall", "api", "driver_evidence", "live", "allocator")
"""The modules declaring tables, in catalog order: each holds `CATALOG` (`Catalog`: its
trace layers and its tables). A new layer's tables are a module of their own (here, or a
dotted name anywhere) and its name in this line; `TABLES`, `LAYERS`, the docs, `info`
and the writer take them from there."""

TABLES: dict[str, Table] = {}
"""Every table, by name, in catalog order."""
LAYERS: dict[str, tuple[str, ...]] = {}
"""Tables each trace layer writes. `driver` is in-kernel driver hooks (PMM chunks, fault
batches); `uvm_tools` is the driver's own UVM tools event stream and counters
(no kernel hooks); `rm_query` is RM queries of our own client (GPU memory, and per
process); `live` is what the recorder concluded while recording (alerts); `allocator`
is PyTorch's caching
allocator (segments, tensors, its memory history), imported from a memory snapshot
(`gputrace import torch-snapshot`) or recorded live by the torch_allocator recorder
layer."""


def _relink() -> None:
    for layer in LAYERS:  # a table may belong to layers of other modules (faults)
        LAYERS[layer] = tuple(t.name for t in TABLES.values() if layer in t.layers)


def add(catalog: Catalog) -> None:
    """Add a module's layers and tables to `TABLES` and `LAYERS` (the catalog's modules at
    import; a test's toy layer the same way). A table or layer already there is refused."""
    twice = sorted(set(catalog.layers) & set(LAYERS)) + sorted(
        {t.name for t in catalog.tables} & set(TABLES))
    if twice:
        raise ValueError(f"already in the catalog: {', '.join(twice)}")
    TABLES.update((t.name, t) for t in catalog.tables)
    LAYERS.update(dict.fromkeys(catalog.layers, ()))
    _relink()


def remove(catalog: Catalog) -> None:
    """Take back what `add(catalog)` added (a test's toy layer, after the test)."""
    for t in catalog.tables:
        TABLES.pop(t.name, None)
    for layer in catalog.layers:
        LAYERS.pop(layer, None)
    _relink()


for _name in CATALOG_MODULES:
    add(importlib.import_module(_name if "." in _name else f"{__name__}.{_name}").CATALOG)

SCHEMA_VERSION: int = schema_version(TABLES.values())
"""The tables' version, written into every part and manifest: the newest column's
`since` (`Column.since`), so adding a column is its own line, no bump elsewhere."""


MANIFEST_FIELDS: tuple[tuple[str, str], ...] = (
    ("format, format_version, schema_version, gputrace_version",
     "what wrote the trace and in which format"),
    ("status", "`recording` until the recorder finished, then `complete`"),
    ("trace_id", "the recording's identity, a random UUID the recorder draws at start; "
     "`gputrace export` files the trace under it (docs/fleet.md). Optional: without it "
     "export derives one (the fleet column `trace_id`)"),
    ("layers", "layers recorded (the Layers table below); a table of a layer not listed "
     "is unknown, not empty"),
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
    ("driver_layer.pid_sample_interval_ms", "period of the gpu_process_memory samples "
     "(incidents add their own gpu_memory and gpu_process_memory samples at once)"),
    ("api.python", "Python frames of API stacks: versions ({pid: \"3.12\"} of the CPython "
     "processes walked), frames (Python frames kept), unknown_frames (not named: the "
     "process exited before the recorder read its code objects), unknown_reasons ({why: "
     "frames}), pauses (stops for a new Python stack, whose code objects were read "
     "meanwhile), warnings (one line per interpreter that could not be walked: native "
     "frames only); docs/record.md"),
    ("torch_allocator", "the torch_allocator recorder layer (PyTorch's caching allocator, "
     "live; docs/record.md): stacks (`--torch-stacks`), libraries [{path, release, pid}] "
     "probed, attached (its uprobes), skipped [{name, reason}]: each libc10_cuda.so of "
     "no release it knows, not probed"),
    ("gpus", "GPUs: index (the trace GPU index every table uses), memory_bytes, name, uuid"),
    ("synthetic", "true for traces built by gputrace.trace.builder, never recorded"),
    ("imported", "list of what `gputrace import` added: {kind (`torch-snapshot`), layer, "
     "file (its name), sha256, bytes (compressed, as read), gputrace_version, unix_s, "
     "joined (true when written `--into` a recording), plus for a join: pid, "
     "segments_matched, segments, and allocator_sources when the recording's allocator "
     "layer was recorded live: {live, snapshot_parts (table -> the snapshot's part "
     "files)}}; docs/importers.md"),
    ("clock.source", "`CLOCK_MONOTONIC` for a recording; `unix-epoch` for a trace imported "
     "on its own, whose ts_ns are Unix-epoch ns (realtime_offset_ns is then 0)"),
    ("tables.<table>.rows, .parts", "rows and Parquet parts written per table (held, "
     "with `window`)"),
    ("tables.<table>.raw_parts, .raw_records",
     "raw parts (`part-NNNNNN.gtraw`) and the records they hold, until `gputrace convert` "
     "decodes them; readers refuse a trace holding raw parts"),
    ("raw_tables", "tables recorded undecoded (`record --raw`) and their record kind, "
     "e.g. {\"ioctls\": \"ioctl_event\"}; kept after conversion"),
    ("spilled", "work items of ioctl events written raw because they came too fast for "
     "the recorder to decode (docs/record.md), e.g. {\"ioctls\": 37}; the recorder decodes "
     "them when the recording ends"),
    ("converted", "{gputrace_version, unix_s} of the last conversion of raw parts (the "
     "recorder's own after spilling, or `gputrace convert`)"),
    ("window", "what a flight recording (`record --keep`) holds: keep (the option's text), "
     "keep_ns, keep_bytes, from_ts_ns (every event from there on is held; earlier parts "
     "were deleted), deleted_parts, deleted_rows, deleted_bytes, held_bytes, "
     "peak_held_bytes, rotate_s; in an incident trace (`--freeze-on`): from_ts_ns, "
     "to_ts_ns, trigger (`oom`, `alert`), incident_ts_ns, events, detail, deleted_before, "
     "flight_trace_id (the flight recording's trace_id; the incident has its own). "
     "Absent: the whole recording. docs/flight-recorder.md"),
    ("incidents, incidents_dropped", "a flight recording's incident traces: list of {dir "
     "(relative to the trace, `incidents/<UTC time>-<trigger>`), trigger, ts_ns, status "
     "(`open`, `kept`, `failed`)}; incidents past the 64 kept, counted"),
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
