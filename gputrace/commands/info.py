"""`gputrace info`: what a trace holds, and whether it can be trusted."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from gputrace import schema
from gputrace.trace.files import STATUS_COMPLETE
from gputrace.trace.reader import Trace, raw_parts_held, trace_warnings
from gputrace.units import format_bytes


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
    errors = {k: v for k, v in (m.get("decode_errors") or {}).items() if v}
    if errors:
        warnings.append(
            f"{sum(errors.values())} records could not be decoded and were skipped: "
            + ", ".join(f"{k}={v}" for k, v in sorted(errors.items()))
        )
    dl = m.get("driver_layer") or {}
    for f in dl.get("attach_failures") or []:
        warnings.append(
            f"driver layer: no UVM tools tracker on pid {f.get('pid')}: "
            f"{f.get('error')} (its GPU faults and migrations are missing)"
        )
    if dl.get("error"):
        warnings.append(str(dl["error"]))
    py = (m.get("api") or {}).get("python") or {}
    warnings += [f"Python frames: {w}" for w in py.get("warnings") or []]
    if m.get("synthetic"):
        warnings.append("synthetic trace: built by gputrace.trace.builder, not recorded")
    held = raw_parts_held(trace)
    if held is not None:  # its rows are not counted above; reports refuse it
        raws = {t: v["raw_records"] for t, v in (m.get("tables") or {}).items()
                if v.get("raw_records")}  # fmt: skip
        warnings.append(held + (" (" + ", ".join(f"{n} {t} records" for t, n in raws.items())
                                + " announced)" if raws else ""))
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
        "driver_layer": m.get("driver_layer"),
        "decode_errors": m.get("decode_errors", {}),
        "target_exit": m.get("target_exit"),
        "drops": drops,
        "imported": m.get("imported"),
        "window": m.get("window"),
        "incidents": m.get("incidents"),
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
        *([f"exit       {_exit(info['target_exit'])}"] if info.get("target_exit") else []),
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
    py = api.get("python") or {}
    if py.get("versions"):
        versions = sorted(set(map(str, py["versions"].values())))
        lines.append(f"python     CPython {', '.join(versions)} in {len(py['versions'])} "
                     f"process(es); {py.get('frames', 0)} Python frames, "
                     f"{py.get('unknown_frames', 0)} unknown{_unknown_why(py)}")
    lines += _untracked_lines(info.get("cpu_faults"), info.get("driver_layer"))
    lines += _driver_lines(info.get("driver_layer"))
    drops = info["drops"]
    lines.append(
        "drops      " + (", ".join(f"{k}={v}" for k, v in sorted(drops.items())) or "none")
    )
    for imp in info.get("imported") or []:
        if isinstance(imp, dict):  # `gputrace import`: say where the rows came from
            how = "joined to this recording" if imp.get("joined") else "on its own"
            lines.append(f"imported   {imp.get('kind')} {imp.get('file')} ({how}; "
                         f"sha256 {str(imp.get('sha256'))[:16]}...)")
            notes = imp.get("notes")
            for note in notes if isinstance(notes, list) else []:
                lines.append(f"  note     {note}")
    lines += _window_lines(info.get("window"), info.get("incidents"))
    lines.append("rows")
    width = max([14, *(len(n) for n in info["rows"])])
    for name, n in info["rows"].items():
        lines.append(f"  {name:<{width}} {n:>12,}")
    for w in info["warnings"]:
        lines.append(f"warning: {w}")
    return "\n".join(lines)


def _window_lines(w: Any, incidents: Any) -> list[str]:
    """A flight recording's window and disk use (`record --keep`), an incident's span,
    and the incidents kept (`--freeze-on`)."""
    lines = []
    if isinstance(w, dict) and w.get("trigger") is not None:
        lines.append(f"window     incident {w.get('trigger')} at {w.get('incident_ts_ns')} ns: "
                     f"events {w.get('from_ts_ns')} to {w.get('to_ts_ns')} ns")
    elif isinstance(w, dict):
        lines.append(f"window     keeps the last {w.get('keep')}: events from "
                     f"{w.get('from_ts_ns') or 'the start'} ns; "
                     f"{w.get('deleted_parts', 0)} parts deleted "
                     f"({format_bytes(int(w.get('deleted_bytes') or 0))}); holds "
                     f"{format_bytes(int(w.get('held_bytes') or 0))} (peak "
                     f"{format_bytes(int(w.get('peak_held_bytes') or 0))}) and at most one "
                     f"{w.get('rotate_s')} s rotation in memory")
    for inc in incidents or []:
        if isinstance(inc, dict):
            lines.append(f"incident   {inc.get('dir')}: {inc.get('trigger')} at "
                         f"{inc.get('ts_ns')} ns ({inc.get('status')})")
    return lines


def _unknown_why(py: dict[str, Any]) -> str:
    """Why Python frames are unknown: the recorder's reasons with their counts, or
    (traces from before it gave them) the one reason it had then."""
    if not py.get("unknown_frames"):
        return ""
    reasons = py.get("unknown_reasons")
    if not isinstance(reasons, dict) or not reasons:
        return " (the process exited first)"
    return " (" + "; ".join(f"{n}: {why}" for why, n in sorted(reasons.items())) + ")"


def _untracked_lines(cpu: Any, dl: Any) -> list[str]:
    """Managed ranges the in-kernel CPU-fault filter could not hold: are their
    faults missing? Not for processes with a UVM tools tracker, whose CPU faults come
    from the tools stream (the driver's own account, every managed range)."""
    cpu = cpu if isinstance(cpu, dict) else {}
    blocks, ranges = cpu.get("untracked_blocks", 0), cpu.get("untracked_ranges", 0)
    if not (blocks or ranges):
        return []
    what = (f"managed ranges too large for the in-kernel filter: {blocks} blocks, "
            f"{ranges} ranges")  # fmt: skip
    dl = dl if isinstance(dl, dict) else {}
    src = dl.get("cpu_fault_source") or {}
    tracked = src.get("uvm_tools_pids") or [] if isinstance(src, dict) else []
    without = [f.get("pid") for f in dl.get("attach_failures") or [] if isinstance(f, dict)]
    if isinstance(src, dict):
        without += [p for p in src.get("uvm_pids_without_tracker") or [] if p not in without]
    if tracked and not without:
        return [f"note: {what}; no CPU faults are missing: every process using UVM had a "
                f"tracker (pids {_pids(tracked)}) and its CPU faults come from the UVM "
                "tools stream"]  # fmt: skip
    if tracked:
        return [f"warning: {what}: CPU faults of processes without a UVM tools tracker "
                f"(pids {_pids(without)}) in those ranges are missing; those of tracked "
                f"processes (pids {_pids(tracked)}) come from the UVM tools stream"]  # fmt: skip
    return [f"warning: {what} untracked (their CPU faults are missing)"]


def _pids(pids: list[Any]) -> str:
    return ",".join(str(p) for p in pids[:8]) + (" ..." if len(pids) > 8 else "")


def _exit(ended: dict[str, Any]) -> str:
    """How CMD ended (manifest `target_exit`)."""
    status = ended.get("status")
    if status == "exited":
        return f"exited with status {ended.get('code')}"
    if status == "signaled":
        return f"killed by signal {ended.get('signal')} ({ended.get('signal_name') or '?'})"
    return "still running when the recording stopped"


def _driver_lines(dl: Any) -> list[str]:
    """The driver layer's trackers, attach failures, queue drops and RM sampling."""
    if not isinstance(dl, dict):
        return []
    pids = dl.get("trackers_attached") or []
    pids = pids if isinstance(pids, list) else []
    fails = dl.get("attach_failures") or []
    shown = ",".join(str(p) for p in pids[:8]) + (" ..." if len(pids) > 8 else "")
    lines = [f"trackers   {len(pids)} attached" + (f" (pids {shown})" if pids else "")
             + f", {len(fails)} failed"]  # fmt: skip
    lines += [f"  failed   pid {f.get('pid')}: {f.get('error')}" for f in fails[:5]]
    missed = dl.get("missed_before_attach") or []
    if missed:
        lines.append(f"  note     {len(missed)} process(es) attached while already running: "
                     "their earlier UVM events are not in the trace")  # fmt: skip
    rm = dl.get("rm_client") or {}
    if isinstance(rm, dict):
        lines.append(
            f"rm         {rm.get('samples', 0)} GPU memory samples every "
            f"{dl.get('sample_interval_ms')} ms" if rm.get("open")
            else f"rm         no RM client: {rm.get('error') or 'not opened'}"
        )
        if rm.get("open") and "pid_samples" in rm:  # recorders that ask per process
            lines.append(
                f"  per pid  {rm.get('pid_samples', 0)} samples every "
                f"{dl.get('pid_sample_interval_ms')} ms, {rm.get('pid_query_failures', 0)} "
                f"refused; {rm.get('incident_samples', 0)} incident samples")  # fmt: skip
    return lines


def _target(target: dict[str, Any]) -> str:
    """`pids 1496,1497`, `command CMD ARGS (pid N)`, `whole host`."""
    if not target:
        return "?"
    mode = target.get("mode")
    pids = ",".join(str(p) for p in target.get("pids") or [])
    if mode == "host":
        return "whole host"
    if mode == "pids":
        return f"pids {pids or '?'}"
    if mode == "command":
        cmd = " ".join(str(a) for a in target.get("command") or [])
        return f"command {cmd}" + (f" (pid {pids})" if pids else "")
    return str(mode or "?") + (f" pids {pids}" if pids else "")
