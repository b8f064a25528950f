"""`gputrace info`: what a trace holds, and whether it can be trusted."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from gputrace import schema
from gputrace.tracedir import STATUS_COMPLETE, Trace, trace_warnings


def trace_info(trace: Trace) -> dict[str, Any]:
    """Summary of a trace: manifest facts, rows per table, and warnings."""
    m = trace.manifest
    rows = {name: trace.rows(name) for name in schema.TABLES}
    drops = trace.drops
    warnings = []
    if trace.status != STATUS_COMPLETE:
        warnings.append(
            f"trace status is {trace.status!r}: the recorder did not finish "
            "(killed or still running); the last rotation interval may be missing"
        )
    if sum(drops.values()):
        warnings.append(
            f"{sum(drops.values())} events were dropped by full ring buffers: "
            + ", ".join(f"{k}={v}" for k, v in sorted(drops.items()) if v)
        )
    if m.get("synthetic"):
        warnings.append("synthetic trace: built by gputrace.builder, not recorded")
    warnings += trace_warnings(trace)
    start, end = m.get("start_ts_ns"), m.get("end_ts_ns")
    return {
        "path": str(trace.path),
        "status": trace.status,
        "format_version": m.get("format_version"),
        "schema_version": m.get("schema_version"),
        "gputrace_version": m.get("gputrace_version"),
        "synthetic": bool(m.get("synthetic", False)),
        "host": m.get("host", {}),
        "driver_version": m.get("driver_version"),
        "gpus": m.get("gpus", []),
        "target": m.get("target", {}),
        "start_ts_ns": start,
        "end_ts_ns": end,
        "duration_s": (end - start) / 1e9 if isinstance(start, int) and isinstance(end, int)
        else None,
        "start_wall": _wall(m, start),
        "layers": trace.layers,
        "hooks": m.get("hooks", {}),
        "api": m.get("api"),
        "cpu_faults": m.get("cpu_faults"),
        "drops": drops,
        "rows": rows,
        "warnings": warnings,
    }


def _wall(m: dict[str, Any], ts: Any) -> str | None:
    offset = m.get("clock", {}).get("realtime_offset_ns")
    if not isinstance(ts, int) or not isinstance(offset, int):
        return None
    return datetime.fromtimestamp((ts + offset) / 1e9, tz=timezone.utc).isoformat()


def render_info(info: dict[str, Any], fmt: str = "text") -> str:
    if fmt == "json":
        return json.dumps(info, indent=2, sort_keys=True)
    host = info["host"]
    lines = [
        f"trace      {info['path']}",
        f"status     {info['status']}",
        f"format     {info['format_version']} (schema {info['schema_version']}, "
        f"written by gputrace {info['gputrace_version']})",
        f"host       {host.get('hostname', '?')}  kernel {host.get('kernel', '?')}  "
        f"{host.get('machine', '')}".rstrip(),
        f"driver     {info['driver_version'] or 'not loaded / unknown'}",
        f"gpus       {len(info['gpus'])}",
        f"target     {_target(info['target'])}",
        f"start      {info['start_wall'] or '?'}",
        f"duration   {info['duration_s']:.3f} s" if info["duration_s"] is not None
        else "duration   ?",
        f"layers     {', '.join(info['layers']) or 'none'}",
    ]
    hooks = info["hooks"]
    attached = hooks.get("attached", [])
    skipped = hooks.get("skipped", [])
    lines.append(f"hooks      {len(attached)} attached, {len(skipped)} skipped")
    by_reason: dict[str, list[str]] = {}
    for s in skipped:
        if isinstance(s, dict):
            by_reason.setdefault(str(s.get("reason")), []).append(str(s.get("name")))
    for reason, names in by_reason.items():
        shown = ", ".join(n.split("@")[0] for n in names[:3])
        more = f" (+{len(names) - 3} more; --json lists all)" if len(names) > 3 else ""
        lines.append(f"  skipped  {len(names)} x {reason}: {shown}{more}")
    notes = hooks.get("notes", {})
    if isinstance(notes, dict):
        lines += [f"  note     {hook}: {note}" for hook, note in notes.items()]
    api = info.get("api") or {}
    if api.get("libraries"):
        lines.append(
            f"api        {', '.join(api['libraries'])}; {api.get('stack_frames', 0)} stack "
            f"frames, {api.get('unresolved_frames', 0)} unresolved"
        )
    cpu = info.get("cpu_faults") or {}
    if cpu.get("untracked_blocks") or cpu.get("untracked_ranges"):
        lines.append(
            f"warning: managed ranges too large for the in-kernel filter: "
            f"{cpu.get('untracked_blocks', 0)} blocks, {cpu.get('untracked_ranges', 0)} ranges "
            "untracked (their CPU faults are missing)"
        )
    drops = info["drops"]
    lines.append(
        "drops      " + (", ".join(f"{k}={v}" for k, v in sorted(drops.items())) or "none")
    )
    lines.append("rows")
    for name, n in info["rows"].items():
        lines.append(f"  {name:<14} {n:>12,}")
    for w in info["warnings"]:
        lines.append(f"warning: {w}")
    return "\n".join(lines)


def _target(target: dict[str, Any]) -> str:
    if not target:
        return "?"
    parts = [str(target.get("mode", "?"))]
    if target.get("pids"):
        parts.append("pids " + ",".join(str(p) for p in target["pids"]))
    if target.get("command"):
        parts.append(" ".join(target["command"]))
    return " ".join(parts)
