"""Every enumeration a table stores, code -> name, and the UVM tools ABI's codes
mapped to ours: the one place each of these constants is written.

Codes are what the BPF programs and decoders emit; names are what users read.
The BPF `GT_*` defines are checked against these by tests/unit/record/test_bpf_defines.py.
"""

from __future__ import annotations

DEVICE_KINDS: dict[int, str] = {0: "unknown", 1: "ctl", 2: "gpu", 3: "uvm", 4: "uvm-tools"}
_DEVICE_CODES = {name: code for code, name in DEVICE_KINDS.items()}
DEV_CTL, DEV_GPU, DEV_UVM, DEV_UVM_TOOLS = (
    _DEVICE_CODES[n] for n in ("ctl", "gpu", "uvm", "uvm-tools"))
"""DEVICE_KINDS codes by name, for code that tests a kind."""
MAPPING_OPS: dict[int, str] = {1: "mmap", 2: "munmap"}
FD_OPS: dict[int, str] = {1: "open", 2: "close", 3: "dup", 4: "seen"}
FAULT_SOURCES: dict[int, str] = {
    0: "unknown",
    1: "cpu",
    2: "gpu_replayable",
    3: "gpu_non_replayable",
    4: "access_counter",
}
# uvm_fault_access_type_t (docs/driver-facts.md §3.3); CPU faults use READ/WRITE.
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
# uvm_fault_type_t (docs/driver-facts.md §3.3); 255 = not known (CPU faults).
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
"""Codes are the UVM tools UvmEventType values (docs/driver-facts.md §5.1)."""
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

# ------------------------------------------------ PyTorch caching allocator
ALLOCATOR_ACTIONS: dict[int, str] = {
    0: "alloc",
    1: "free_requested",
    2: "free_completed",
    3: "segment_alloc",
    4: "segment_free",
    5: "segment_map",
    6: "segment_unmap",
    7: "snapshot",
    8: "oom",
    9: "user_defined",
}
"""Trace entry actions of a PyTorch memory snapshot (`TraceEntry::Action`, by the
names the snapshot spells them)."""
BLOCK_STATES: dict[int, str] = {
    0: "inactive",
    1: "active_allocated",
    2: "active_pending_free",
}
"""States of a block of a PyTorch memory snapshot: cached and free; held by a tensor;
freed by the program but still in use by another stream."""

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
    "action": ALLOCATOR_ACTIONS,
    "state": BLOCK_STATES,
}
