"""When does `gputrace analyze --fail-on` fail the run? One condition per gate,
read from its report's JSON object; the registry attaches each to its report.
"""

from __future__ import annotations

from typing import Any


def leaks_hit(rep: dict[str, Any], _: float) -> str | None:
    n = rep["total_count"]
    return f"leaks: {n} leaked allocations ({rep['total_bytes']} bytes)" if n else None


def growth_hit(rep: dict[str, Any], _: float) -> str | None:
    pids = rep["growing_pids"]
    return f"growth: memory climbing in pid(s) {pids}" if pids else None


def thrashing_hit(rep: dict[str, Any], _: float) -> str | None:
    blocks = (rep.get("thrashing") or {}).get("blocks")
    return f"thrashing: {len(blocks)} block-windows" if blocks else None


def thrashing_blind(rep: dict[str, Any]) -> str | None:
    return "thrashing (layer driver not recorded)" if rep.get("thrashing") is None else None


def fragmentation_hit(rep: dict[str, Any], x: float) -> str | None:
    # PMM chunks (driver layer) and RM samples (rm_query): either may be absent
    worst = max([*(s[at]["fragmentation_index"] or 0.0 for s in rep["gpus"] or []
                   for at in ("peak", "end") if s.get(at)),
                 *(g["worst"]["unusable_share"] or 0.0
                   for g in (rep.get("rm") or {}).get("gpus", []))], default=0.0)
    return f"fragmentation: index {worst:.3f} > {x}" if worst > x else None


def oom_hit(rep: dict[str, Any], _: float) -> str | None:
    n = rep["count"]
    if not n:
        return None
    verdicts = ", ".join(f"{v['incidents']} {v['verdict']}" for v in rep["by_verdict"])
    return f"oom: {n} out-of-memory incident(s) ({verdicts})"
