"""The schema module is the one place every column is defined."""

from __future__ import annotations

from gputrace import schema
from gputrace.schema.markdown import render_markdown
from tests.conftest import ROOT


def test_docs_trace_format_is_generated_from_schema() -> None:
    doc = (ROOT / "docs" / "trace-format.md").read_text()
    assert doc == render_markdown(), (
        "docs/trace-format.md is stale: run `python -m gputrace.schema > docs/trace-format.md`"
    )


def test_required_tables_and_columns() -> None:
    assert set(schema.TABLES) >= {  # a new layer adds its tables without editing this
        "processes", "ioctls", "files", "mappings", "cuda_calls", "stacks",
        "faults", "fault_batches", "migrations", "chunks", "uvm_events", "uvm_counters",
        "gpu_memory", "gpu_process_memory", "alerts", "allocator_segments",
        "allocator_blocks", "allocator_events", "allocator_frames",
    }
    ioctls = {c.name for c in schema.IOCTLS.columns}
    assert {
        "ts_ns", "pid", "tid", "comm", "device", "gpu_index", "fd", "cmd", "name", "ret",
        "status", "latency_ns", "h_client", "h_parent", "h_object", "h_class", "size_bytes",
        "va_base", "va_length",
    } <= ioctls
    cuda = {c.name for c in schema.CUDA_CALLS.columns}
    assert {"ts_ns", "pid", "tid", "comm", "func", "size_bytes", "ptr", "result",
            "latency_ns", "stack_id"} <= cuda


def test_columns_are_documented_snake_case_and_unique() -> None:
    for t in schema.TABLES.values():
        names = [c.name for c in t.columns]
        assert len(names) == len(set(names)), t.name
        for c in t.columns:
            assert c.name == c.name.lower() and " " not in c.name
            assert c.doc, f"{t.name}.{c.name} has no meaning"
            if c.name.endswith("_ns"):
                assert c.unit == "ns"
            if c.name.endswith("_bytes"):
                assert c.unit == "bytes"


def test_every_enum_has_code_and_name_columns() -> None:
    for t in schema.TABLES.values():
        names = {c.name for c in t.columns}
        for n in (c.name for c in t.columns if c.unit == "enum"):
            if n.endswith("_code"):
                assert n.removesuffix("_code") in schema.ENUMS
                assert n.removesuffix("_code") in names


def test_polars_schema_matches_arrow_schema() -> None:
    for t in schema.TABLES.values():
        assert list(t.polars_schema.names()) == [c.name for c in t.columns]


def test_tools_enum_mappings_land_on_known_codes() -> None:
    """The tools ABI numbers its enums differently; every mapped value must exist."""
    for mapping, target in (
        (schema.TOOLS_FAULT_TYPES, schema.FAULT_TYPES),
        (schema.TOOLS_ACCESS_TYPES, schema.ACCESS_TYPES),
        (schema.TOOLS_CLIENT_TYPES, schema.FAULT_SOURCES),
        (schema.TOOLS_MIGRATION_CAUSES, schema.MIGRATION_CAUSES),
        (schema.TOOLS_FATAL_REASONS, schema.UVM_EVENT_REASONS),
        (schema.TOOLS_MAP_REMOTE_CAUSES, schema.UVM_EVENT_REASONS),
    ):
        assert set(mapping.values()) <= set(target)
    assert schema.FAULT_TYPES[schema.TOOLS_FAULT_TYPES[1]] == "invalid_pde"
    assert schema.FAULT_TYPES[schema.TOOLS_FAULT_TYPES[2]] == "invalid_pte"
    assert schema.MIGRATION_CAUSES[schema.TOOLS_MIGRATION_CAUSES[4]] == "eviction"


def test_layers_name_every_table() -> None:
    named = {n for tables in schema.LAYERS.values() for n in tables}
    assert named == set(schema.TABLES)


def test_rm_query_layer_tables_and_incident_columns() -> None:
    assert schema.LAYERS["rm_query"] == ("gpu_memory", "gpu_process_memory")
    cols = [c.name for c in schema.GPU_MEMORY.columns]
    # appended last, nullable: parts written before them read them as null
    assert cols[-2:] == ["trigger", "delay_ns"]
    assert all(schema.GPU_MEMORY.columns[-i].nullable for i in (1, 2))
    assert [c.name for c in schema.GPU_PROCESS_MEMORY.columns] == [
        "ts_ns", "gpu_index", "pid", "vidmem_bytes", "trigger", "status"]


def test_gpu_memory_parts_older_than_the_incident_columns_read_them_as_null() -> None:
    from gputrace.trace.reader import open_trace
    from tests.conftest import FIXTURES

    trace = open_trace(FIXTURES / "real-h200-driver-cuda" / "trace")
    df = trace.scan("gpu_memory").collect()
    assert df.height > 0
    assert df["trigger"].null_count() == df.height
    assert df["delay_ns"].null_count() == df.height
    assert trace.scan("gpu_process_memory").collect().height == 0
