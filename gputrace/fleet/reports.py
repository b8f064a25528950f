"""Fleet questions from per-trace reports: one partial per trace, merged by the engine.

A partial holds what the fleet answers need from one trace's `analyze` document:
leak totals, leaking jobs and call sites, the memory each process held when it exited
or the trace ended (one figure per process from the joined allocation model, the
leak report's `held_at_end`: never the layers added), per-GPU fragmentation and
oversubscription, the fault rate, drops and status. `merge` is associative and
commutative (the engine may combine partials in any tree); lists ranked by a
figure unique to one trace (a job, a GPU) are cut to the top N at every merge,
which loses nothing: the fleet's top N is among the top N of the parts.

Which reports feed which fleet answers is their registry entries' `FleetUse`: the
answers above read the reports that name them, and a report that declares `sums` has
those figures added up over the traces that recorded it (`totals`), whatever it is.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import polars as pl

from gputrace.analyses import registry

EMPTY: dict[str, Any] = {"traces": 0, "leak_bytes": 0, "leak_count": 0, "held_bytes": 0,
                         "jobs": [], "holders": [], "sites": {}, "gpus": [], "rows": [],
                         "reports": [], "totals": {}}
_TRACE_KEYS = ("trace_id", "host", "date", "driver_version", "gpu_model", "status")


def flags(status: str, dropped: int) -> list[str]:
    """Why a trace's figures are lower bounds: unfinished recording, lost events."""
    out = [] if status == "complete" else [f"status {status}"]
    return out + ([f"{dropped} events dropped"] if dropped else [])


def report_totals(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Of each report whose entry declares fleet `sums`: whether this trace recorded it
    (`traces`: 1 or 0) and those figures (0 when absent or not numbers)."""
    out = {}
    for spec in registry.REPORTS:
        if spec.fleet.sums:
            rep = doc.get(spec.key) or {}
            on = bool(rep.get("recorded"))
            out[spec.key] = {"traces": int(on), **{
                f: v if on and isinstance(v := rep.get(f), (int, float))
                and not isinstance(v, bool) else 0 for f in spec.fleet.sums}}
    return out


def trace_partial(entry: dict[str, Any], doc: dict[str, Any], procs: pl.DataFrame,
                  keep_report: bool) -> dict[str, Any]:
    """The partial of one trace from its `analyze` document and processes table."""
    who = {k: entry.get(k) for k in _TRACE_KEYS}
    where = {"host": who["host"], "trace_id": who["trace_id"]}
    leaks = doc.get("leaks") or {}
    cmd = {int(r["pid"]): r["cmdline"] for r in procs.select("pid", "cmdline").to_dicts()}
    jobs: dict[int, dict[str, Any]] = {}
    for a in leaks.get("leaked") or []:
        j = jobs.setdefault(int(a["pid"]), {**where, "pid": int(a["pid"]), "comm": a.get("comm"),
                                            "cmdline": cmd.get(int(a["pid"])), "bytes": 0,
                                            "count": 0})
        j["bytes"] += int(a.get("bytes") or 0)
        j["count"] += int(a.get("pieces") or 1)  # a row folds identical pieces
    held = leaks.get("held_at_end") or {}
    holders = [{**where, **h, "cmdline": cmd.get(int(h["pid"]))}
               for h in held.get("processes") or []]
    sites = {}
    for s in leaks.get("leak_sites") or []:
        key = f"{s.get('what')}\x00{s.get('frames')}"
        sites[key] = {"what": s.get("what"), "frames": s.get("frames"), "bytes": s["bytes"],
                      "count": s["count"], "hosts": [who["host"]], "traces": 1}
    gpus: dict[int, dict[str, Any]] = {}

    def gpu(i: int) -> dict[str, Any]:
        return gpus.setdefault(i, {**where, "gpu_model": who["gpu_model"], "gpu_index": i,
                                   "fragmentation_index": None, "unusable_share": None,
                                   "resident_ratio": None, "memory_bytes": None})
    frag = doc.get("fragmentation") or {}
    for g in frag.get("gpus") or []:
        idx = [g[at]["fragmentation_index"] for at in ("peak", "end")
               if g.get(at) and g[at].get("fragmentation_index") is not None]
        gpu(g["gpu_index"]).update(fragmentation_index=max(idx, default=None),
                                   memory_bytes=g.get("memory_bytes"))
    for g in (frag.get("rm") or {}).get("gpus") or []:
        gpu(g["gpu_index"])["unusable_share"] = (g.get("worst") or {}).get("unusable_share")
    fr = doc.get("fault_rate") or {}
    for g in (fr.get("oversubscription") or {}).get("resident_by_gpu") or []:
        gpu(g["gpu_index"]).update(resident_ratio=g.get("ratio"),
                                   resident_peak_bytes=g.get("resident_peak_bytes"))
    over = fr.get("oversubscription") or {}
    facts = doc.get("trace") or {}
    dur = float(facts.get("duration_s") or 0.0)
    faults = sum(int(r.get("faults") or 0) for r in fr.get("rates") or []) if fr.get("recorded") \
        else None
    dropped = sum(entry.get("drops", {}).values())
    row = {**who, "dropped": dropped, "drops": entry.get("drops", {}),
           "leak_bytes": leaks.get("total_bytes"), "leak_count": leaks.get("total_count"),
           "faults": faults, "duration_s": dur, "gpu_memory_bytes": over.get("gpu_memory_bytes"),
           "managed_peak_bytes": over.get("managed_peak_bytes"),
           "oversubscription_ratio": over.get("ratio"),
           "faults_per_s": faults / dur if faults is not None and dur > 0 else None,
           "flags": flags(str(who["status"]), dropped)}
    return {"traces": 1, "leak_bytes": int(leaks.get("total_bytes") or 0),
            "leak_count": int(leaks.get("total_count") or 0), "jobs": list(jobs.values()),
            "held_bytes": int(held.get("bytes") or 0), "holders": holders,
            "sites": sites, "gpus": list(gpus.values()), "rows": [row],
            "reports": [{**where, "report": doc}] if keep_report else [],
            "totals": report_totals(doc)}


def _top(rows: list[dict[str, Any]], key: str, n: int | None) -> list[dict[str, Any]]:
    ranked = sorted((r for r in rows if r.get(key) is not None),
                    key=lambda r: (-r[key], str(r["host"]), r["trace_id"], r.get("pid", 0),
                                   r.get("gpu_index", 0)))
    return ranked[:n] if n is not None else ranked


def merge(parts: Iterable[dict[str, Any]], top: int | None) -> dict[str, Any]:
    """One partial of many (the engine's reduce step)."""
    out: dict[str, Any] = {**EMPTY, "sites": {}, "totals": {}}
    jobs: list[dict[str, Any]] = []
    holders: list[dict[str, Any]] = []
    gpus: list[dict[str, Any]] = []
    for p in parts:
        for k in ("traces", "leak_bytes", "leak_count", "held_bytes"):
            out[k] += p.get(k, 0)
        jobs += p["jobs"]
        holders += p.get("holders", [])
        gpus += p["gpus"]
        out["rows"] = out["rows"] + p["rows"]
        out["reports"] = out["reports"] + p["reports"]
        for key, t in p.get("totals", {}).items():
            mine = out["totals"].get(key)
            out["totals"][key] = dict(t) if mine is None else {k: mine[k] + v
                                                               for k, v in t.items()}
        for key, s in p["sites"].items():
            mine = out["sites"].get(key)
            out["sites"][key] = dict(s) if mine is None else {
                **mine, "bytes": mine["bytes"] + s["bytes"], "count": mine["count"] + s["count"],
                "traces": mine["traces"] + s["traces"],
                "hosts": sorted({*mine["hosts"], *s["hosts"]}, key=str)}
    out["jobs"] = _top(jobs, "bytes", top)
    out["holders"] = _top(holders, "held_bytes", top)  # a (trace, pid) is in one part
    keep = {id(g) for k in ("fragmentation_index", "unusable_share", "resident_ratio")
            for g in _top(gpus, k, top)}
    out["gpus"] = [g for g in gpus if id(g) in keep]
    return out
