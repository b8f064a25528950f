"""The fleet document: the merged partial ranked and cut into the fleet questions'
answers (leaks, GPUs, fault-rate outliers per driver version, drops per host, flags)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from gputrace.analyses import registry

OUTLIER_Z = 3.5
"""Modified z-score (Iglewicz and Hoaglin) above which a trace's fault rate is an
outlier among the traces of its driver version."""


def fault_outliers(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per driver version: its traces' fault rates (median, MAD) and the traces far above."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r["faults_per_s"] is not None:
            groups[str(r["driver_version"])].append(r)
    out = []
    for version, rs in groups.items():
        rates = [r["faults_per_s"] for r in rs]
        med = statistics.median(rates)
        mad = statistics.median(abs(x - med) for x in rates)
        outliers = []
        for r in rs:
            if mad > 0:
                z: float | None = 0.6745 * (r["faults_per_s"] - med) / mad
                hit = z is not None and z > OUTLIER_Z
            else:  # most traces agree exactly: any higher rate stands out
                z, hit = None, len(rs) >= 3 and r["faults_per_s"] > med
            if hit:
                outliers.append({"trace_id": r["trace_id"], "host": r["host"],
                                 "faults_per_s": r["faults_per_s"], "modified_z": z})
        out.append({"driver_version": None if version == "None" else version,
                    "traces": len(rs), "faults": sum(r["faults"] for r in rs),
                    "median_faults_per_s": med, "mad_faults_per_s": mad,
                    "max_faults_per_s": max(rates),
                    "outliers": sorted(outliers, key=lambda o: -o["faults_per_s"])})
    return sorted(out, key=lambda g: (-g["median_faults_per_s"], str(g["driver_version"])))


def drops_by_host(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    hosts: dict[str, dict[str, Any]] = {}
    for r in rows:
        h = hosts.setdefault(str(r["host"]), {"host": r["host"], "traces": 0,
                                              "traces_with_drops": 0, "dropped": 0})
        h["traces"] += 1
        h["traces_with_drops"] += bool(r["dropped"])
        h["dropped"] += r["dropped"]
    return sorted(hosts.values(), key=lambda h: (-h["dropped"], str(h["host"])))


def _rank(rows: list[dict[str, Any]], key: str, top: int | None) -> list[dict[str, Any]]:
    ranked = sorted((r for r in rows if r.get(key) is not None),
                    key=lambda r: (-r[key], str(r["host"]), r["trace_id"], r.get("gpu_index", 0)))
    return ranked[:top] if top is not None else ranked


def fleet_document(part: dict[str, Any], *, top: int | None, dataset: str,
                   where: str | None, engine: dict[str, Any]) -> dict[str, Any]:
    """The JSON document of `gputrace fleet analyze` (docs/fleet.md lists its keys)."""
    rows = sorted(part["rows"], key=lambda r: (str(r["date"]), str(r["host"]), r["trace_id"]))
    sites = sorted(part["sites"].values(),
                   key=lambda s: (-s["bytes"], str(s["what"]), str(s["frames"])))
    for s in sites:
        s["host_count"] = len(s["hosts"])
    flagged = [{"trace_id": r["trace_id"], "host": r["host"], "date": r["date"],
                "reasons": r["flags"]} for r in rows if r["flags"]]
    warnings = [f"{len(flagged)} of {len(rows)} traces are flagged (unfinished or with "
                "dropped events): their figures are lower bounds"] if flagged else []
    doc: dict[str, Any] = {
        "dataset": dataset, "where": where, "traces": part["traces"], "engine": engine,
        "leaks": {"total_bytes": part["leak_bytes"], "total_count": part["leak_count"],
                  "top_jobs": _rank(part["jobs"], "bytes", top),
                  "top_sites": sites[:top] if top is not None else sites},
        # each process's one held figure (layers a breakdown), added over the traces
        "holders": {"held_bytes": part.get("held_bytes", 0),
                    "top_processes": _rank(part.get("holders", []), "held_bytes", top)},
        "gpus": {"by_fragmentation": _rank(part["gpus"], "fragmentation_index", top),
                 "by_rm_unusable_share": _rank(part["gpus"], "unusable_share", top),
                 "by_resident_share": _rank(part["gpus"], "resident_ratio", top),
                 "by_oversubscription": _rank(rows, "oversubscription_ratio", top)},
        "fault_rate": {"by_driver_version": fault_outliers(rows), "outlier_z": OUTLIER_Z},
        "drops": {"total": sum(r["dropped"] for r in rows), "by_host": drops_by_host(rows)},
        "flagged": flagged, "trace_list": rows, "warnings": warnings,
        "report_totals": {s.key: part.get("totals", {}).get(
            s.key, {"traces": 0, **dict.fromkeys(s.fleet.sums, 0)})
            for s in registry.REPORTS if s.fleet.sums},
        "not_aggregated": [{"report": s.name, "title": s.title, "why": s.fleet.why_not}
                           for s in registry.REPORTS
                           if not s.fleet.answers and not s.fleet.sums],
    }
    if part["reports"]:
        doc["per_trace"] = sorted(part["reports"], key=lambda r: r["trace_id"])
    return doc
