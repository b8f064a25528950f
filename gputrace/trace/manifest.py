"""What a trace's `manifest.json` may hold, checked before anything uses it.

A manifest is JSON that anyone can edit, so every field the reports read is
validated against a pydantic model here: a wrong type, a negative count or an
end before the start is one line naming the field, never a traceback later in
an analysis. Fields this gputrace does not know are kept as they are (a newer
recorder may add some); only their nesting depth is bounded.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr
from pydantic import ValidationError as _PydanticError

from gputrace import schema
from gputrace.errors import TraceError

FORMAT_NAME = schema.FORMAT_NAME
FORMAT_VERSION = schema.FORMAT_VERSION
MAX_BYTES = 16 << 20
"""A manifest is a few kB even with thousands of hooks; more is not ours."""
MAX_DEPTH = 32
"""Our manifests nest 4 levels deep; deeper input would only exhaust the stack."""

TRACE_ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}"
"""What a manifest `trace_id` may be: it names files of a fleet dataset, so no
path separators or leading dots. The recorder writes a random UUID."""

I64_MAX = (1 << 63) - 1
"""Every integer of a manifest is a 64-bit field: the recorder writes nothing larger, and
a larger one overflows the Int64 columns it meets and the date it is shown as."""
Count = Annotated[StrictInt, Field(ge=0, le=I64_MAX)]
Stamp = Annotated[StrictInt, Field(ge=0, le=I64_MAX)]
Offset = Annotated[StrictInt, Field(ge=-I64_MAX, le=I64_MAX)]
"""Monotonic to Unix-epoch nanoseconds: a stamp plus it is a date between 1677 and 2554."""


class _Model(BaseModel):
    # strict: a count given as "3" or 3.0 or true is as wrong as one given as [] —
    # the recorder never writes those, so they mean the file was edited or damaged.
    model_config = ConfigDict(strict=True, extra="allow", frozen=True)


class Skipped(_Model):
    name: StrictStr
    reason: StrictStr = ""


class Hooks(_Model):
    attached: list[StrictStr] = []
    skipped: list[Skipped] = []
    notes: dict[str, StrictStr] = {}


class TableEntry(_Model):
    rows: Count
    parts: Count


class HostFacts(_Model):
    hostname: StrictStr | None = None
    kernel: StrictStr | None = None
    machine: StrictStr | None = None


class Driver(_Model):
    version: StrictStr | None = None
    source: StrictStr | None = None
    layouts_of: StrictStr | None = None


class Gpu(_Model):
    index: Count
    path: StrictStr | None = None
    name: StrictStr | None = None
    memory_bytes: Count | None = None
    uuid: StrictStr | None = None


class Clock(_Model):
    source: StrictStr | None = None
    realtime_offset_ns: Offset | None = None
    uvm_events: StrictStr | None = None


class AttachFailure(_Model):
    pid: StrictInt
    error: StrictStr = ""


class MissedBeforeAttach(_Model):
    pid: StrictInt
    attached_ts_ns: Stamp | None = None


class DriverLayerFacts(_Model):
    trackers_attached: Any = None  # a count or the pids: no reader depends on its shape
    attach_failures: list[AttachFailure] = []
    missed_before_attach: list[MissedBeforeAttach] = []
    sample_interval_ms: float | None = None


class TargetFacts(_Model):
    mode: StrictStr = "?"
    command: list[StrictStr] | None = None
    pids: list[StrictInt] = []


class ApiPython(_Model):
    """Python frames of API stacks: the CPython minor version per pid walked, frames
    kept, frames not named, one line per interpreter that could not be walked."""

    versions: dict[StrictStr, StrictStr] = {}
    frames: Count = 0
    unknown_frames: Count = 0
    unknown_reasons: dict[StrictStr, Count] = {}  # why -> frames (older traces: none)
    pauses: Count = 0  # stops for a new Python stack, its code objects read meanwhile
    warnings: list[StrictStr] = []


class Api(_Model):
    libraries: list[StrictStr] = []
    stack_frames: Count = 0
    unresolved_frames: Count = 0
    stack_errors: Count = 0
    pauses: Count = 0
    python: ApiPython | None = None


class TargetExit(_Model):
    status: StrictStr
    code: StrictInt | None = None
    signal: StrictInt | None = None
    signal_name: StrictStr | None = None


class RecorderFacts(_Model):
    pid: StrictInt | None = None
    argv: list[StrictStr] = []


class Manifest(_Model):
    """The manifest fields gputrace reads; see docs/trace-format.md."""

    format: StrictStr
    format_version: Annotated[StrictInt, Field(ge=1)]
    schema_version: Count = 0
    gputrace_version: StrictStr | None = None
    status: StrictStr = "unknown"
    trace_id: Annotated[StrictStr, Field(pattern=f"^{TRACE_ID_PATTERN}$")] | None = None
    created_unix_s: float | None = None
    synthetic: StrictBool = False
    host: HostFacts = HostFacts()
    driver_version: StrictStr | None = None
    driver: Driver = Driver()
    gpus: list[Gpu] = []
    device_dir: StrictStr | None = None
    clock: Clock = Clock()
    target: TargetFacts = TargetFacts()
    layers: list[StrictStr] = []
    hooks: Hooks = Hooks()
    drops: dict[str, Count] = {}
    tables: dict[str, TableEntry] = {}
    start_ts_ns: Stamp | None = None
    end_ts_ns: Stamp | None = None
    recorder: RecorderFacts = RecorderFacts()
    api: Api | None = None
    cpu_faults: dict[str, Count] | None = None
    driver_layer: DriverLayerFacts | None = None
    decode_errors: dict[str, Count] = {}
    target_exit: TargetExit | None = None


def parse(data: bytes, where: str) -> dict[str, Any]:
    """The manifest in `data` as a dict, or TraceError naming what is wrong.

    `where` (the manifest's path) starts every message. Checks, in order: size,
    JSON syntax and depth, the format marker and version (so a newer format is
    reported as such, whatever its fields look like), then every known field.
    """
    if len(data) > MAX_BYTES:
        raise TraceError(f"{where}: manifest is {len(data)} bytes, more than a "
                         f"gputrace manifest can be ({MAX_BYTES}); not a gputrace manifest")
    try:
        raw = json.loads(data)
    except RecursionError:
        raise TraceError(f"{where}: unreadable manifest (nested too deeply)") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise TraceError(f"{where}: unreadable manifest ({_first_line(e)})") from None
    deep = _too_deep(raw)
    if deep is not None:
        raise TraceError(f"{where}: manifest field {deep!r} nests deeper than {MAX_DEPTH} "
                         "levels; not a gputrace manifest")
    if not isinstance(raw, dict) or raw.get("format") != FORMAT_NAME:
        raise TraceError(f"{where} is not a gputrace manifest")
    fv = raw.get("format_version")
    if not isinstance(fv, int) or isinstance(fv, bool):
        raise TraceError(f"{where}: format_version missing or not an integer")
    if fv > FORMAT_VERSION:
        raise TraceError(f"{where}: trace format {fv} is newer than this gputrace reads "
                         f"({FORMAT_VERSION}); upgrade gputrace")
    sv = raw.get("schema_version")
    if isinstance(sv, int) and not isinstance(sv, bool) and sv > schema.SCHEMA_VERSION:
        raise TraceError(f"{where}: schema version {sv} is newer than this gputrace reads "
                         f"({schema.SCHEMA_VERSION}); upgrade gputrace")
    validate(raw, where)
    return raw


def validate(raw: dict[str, Any], where: str) -> Manifest:
    """Check every known field of a parsed manifest; TraceError names the first bad one."""
    try:
        m = Manifest.model_validate(raw)
    except _PydanticError as e:
        errors = e.errors(include_url=False)
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise TraceError(f"{where}: {_describe(errors[0])}{more}") from None
    if m.created_unix_s is not None and not math.isfinite(m.created_unix_s):
        raise TraceError(f"{where}: manifest field 'created_unix_s' must be a finite number")
    if m.start_ts_ns is not None and m.end_ts_ns is not None and m.end_ts_ns < m.start_ts_ns:
        raise TraceError(
            f"{where}: manifest field 'end_ts_ns' ({m.end_ts_ns}) is before 'start_ts_ns' "
            f"({m.start_ts_ns}); durations and rates would be negative"
        )
    return m


_EXPECTED = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "string_type": "a string",
    "bool_type": "true or false",
    "float_type": "a number",
    "list_type": "a list",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "missing": "present",
}


def _describe(err: Any) -> str:
    field = _path(err["loc"])
    kind = err["type"]
    got = _json_kind(err.get("input"))
    if kind == "missing":
        return f"manifest field {field!r} is missing"
    if kind in _EXPECTED:
        return f"manifest field {field!r} must be {_EXPECTED[kind]}, not {got}"
    if kind == "less_than_equal" and "le" in err.get("ctx", {}):
        return f"manifest field {field!r} must be <= {err['ctx']['le']}, not {err['input']!r}"
    if kind in ("greater_than_equal", "greater_than"):
        return f"manifest field {field!r} must be >= {err['ctx']['ge']}, not {err['input']!r}" \
            if "ge" in err.get("ctx", {}) else f"manifest field {field!r}: {err['msg']}"
    return f"manifest field {field!r}: {_first_line(err['msg'])} (got {got})"


def _path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return _short(out or "(top level)")


def _short(text: str, limit: int = 80) -> str:
    """Keys come from the file: a megabyte-long one must not become the message."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _too_deep(value: Any) -> str | None:
    """The path of the first value nested deeper than MAX_DEPTH (iterative: no recursion)."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        v, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            return _short(path or "(top level)")
        if isinstance(v, dict):
            stack += [(x, _short(f"{path}.{k}" if path else str(k), 200), depth + 1)
                      for k, x in v.items()]
        elif isinstance(v, list):
            stack += [(x, _short(f"{path}[{i}]", 200), depth + 1) for i, x in enumerate(v)]
    return None


def _first_line(e: object) -> str:
    text = str(e)
    return text.splitlines()[0] if text else type(e).__name__
