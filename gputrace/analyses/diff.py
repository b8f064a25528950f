"""What changed between two traces of the same job?

Input: each trace's report document (`analyze --format json`) and its leaked
bytes by call stack (`stacks_by_bytes.folded_stacks`). Process ids differ from run
to run, so processes are matched by (layer, comm) and leak sites by (layer,
comm, frames); GPUs by index; fault rates by (source, access type, GPU);
ioctl commands by (name, device, GPU). Only what differs is listed: two
traces of identical behaviour give `changed: false` and empty lists.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

Key = tuple[Any, ...]


def _pct(before: float | None, after: float | None) -> float | None:
    if before is None or after is None or before == 0:
        return None
    return (after - before) / before * 100.0


def _delta(before: float | None, after: float | None) -> dict[str, Any]:
    d = None if before is None or after is None else after - before
    return {"before": before, "after": after, "delta": d, "delta_pct": _pct(before, after)}


def _index(rows: Iterable[dict[str, Any]], key: Callable[[dict[str, Any]], Key],
           value: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    out: dict[Key, dict[str, Any]] = {}
    for r in rows:
        k = key(r)
        v = value(r)
        if k in out:  # several pids with one name: add their figures up
            out[k] = {f: (out[k][f] or 0) + (x or 0) for f, x in v.items()}
        else:
            out[k] = dict(v)
    return out


def _compare(names: tuple[str, ...], before: dict[Key, dict[str, Any]],
             after: dict[Key, dict[str, Any]], fields: tuple[str, ...]) -> list[dict[str, Any]]:
    """One row per key whose fields differ (or that exists on one side only)."""
    rows = []
    for k in sorted(set(before) | set(after), key=repr):
        b, a = before.get(k), after.get(k)
        status = "new" if b is None else "gone" if a is None else "changed"
        diffs = {f: _delta((b or {}).get(f), (a or {}).get(f)) for f in fields}
        if status == "changed" and all(d["delta"] in (0, None) and
                                       (b or {}).get(f) == (a or {}).get(f)
                                       for f, d in diffs.items()):
            continue
        rows.append({**dict(zip(names, k, strict=True)), "status": status, **diffs})
    return rows


def _leak_total(doc: dict[str, Any]) -> int | None:
    leaks = doc.get("leaks") or {}
    return leaks.get("total_bytes") if leaks.get("recorded") else None


def diff(before: dict[str, Any], after: dict[str, Any], before_stacks: list[dict[str, Any]],
         after_stacks: list[dict[str, Any]]) -> dict[str, Any]:
    """The changes from `before` to `after` (report documents and their leak stacks)."""
    def sites(stacks: list[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
        return _index(stacks, lambda r: (r["layer"], r["comm"], " < ".join(r["frames"][::-1])),
                      lambda r: {"bytes": r["bytes"], "count": r["count"]})

    def procs(doc: dict[str, Any]) -> dict[Key, dict[str, Any]]:
        rows = (doc.get("summary") or {}).get("processes") or []
        return _index(rows, lambda r: (r["layer"], r["comm"]),
                      lambda r: {"peak_bytes": r["peak_bytes"],
                                 "live_end_bytes": r["live_end_bytes"]})

    def gpus(doc: dict[str, Any]) -> dict[Key, dict[str, Any]]:
        rows = ((doc.get("summary") or {}).get("gpus") or {}).get("gpus") or []
        return _index(rows, lambda r: (r["gpu_index"],),
                      lambda r: {"peak_bytes": r["peak_bytes"], "end_bytes": r["end_bytes"]})

    def rates(doc: dict[str, Any]) -> dict[Key, dict[str, Any]]:
        rows = (doc.get("fault_rate") or {}).get("rates") or []
        return _index(rows, lambda r: (r["source"], r["access_type"], r["gpu_index"]),
                      lambda r: {"faults": r["faults"], "mean_per_s": r["mean_per_s"],
                                 "peak_per_s": r["peak_per_s"]})

    def ioctls(doc: dict[str, Any]) -> dict[Key, dict[str, Any]]:
        rows = (doc.get("summary") or {}).get("ioctls") or []
        qs = ("count", "failed", "latency_ns_p50", "latency_ns_p90", "latency_ns_p99",
              "latency_ns_max")
        # several rows of one key never occur (the summary groups by it); no sums of quantiles
        return {(r["name"], r["device"], r["gpu_index"]): {q: r[q] for q in qs} for r in rows}

    out: dict[str, Any] = {
        "leak_bytes": _delta(_leak_total(before), _leak_total(after)),
        "leak_sites": _compare(("layer", "comm", "stack"), sites(before_stacks),
                               sites(after_stacks), ("bytes", "count")),
        "process_peaks": _compare(("layer", "comm"), procs(before), procs(after),
                                  ("peak_bytes", "live_end_bytes")),
        "gpu_peaks": _compare(("gpu_index",), gpus(before), gpus(after),
                              ("peak_bytes", "end_bytes")),
        "fault_rates": _compare(("source", "access_type", "gpu_index"), rates(before),
                                rates(after), ("faults", "mean_per_s", "peak_per_s")),
        "ioctl_latency": _compare(("name", "device", "gpu_index"), ioctls(before),
                                  ioctls(after), ("count", "failed", "latency_ns_p50",
                                                  "latency_ns_p90", "latency_ns_p99",
                                                  "latency_ns_max")),
    }
    lb = out["leak_bytes"]
    out["changed"] = bool(lb["delta"] or lb["before"] != lb["after"]
                          or any(out[k] for k in ("leak_sites", "process_peaks", "gpu_peaks",
                                                  "fault_rates", "ioctl_latency")))
    return out


def peak_increase(d: dict[str, Any]) -> tuple[float, float | None, str] | None:
    """The largest peak rise of any process or GPU: (bytes, percent, what); None if none
    rose."""
    best: tuple[float, float | None, str] | None = None
    for key, what in (("process_peaks", "process"), ("gpu_peaks", "GPU")):
        for r in d[key]:
            p = r["peak_bytes"]
            rise = (p["after"] or 0) - (p["before"] or 0)
            name = (f"{what} {r.get('comm', r.get('gpu_index'))}"
                    + (f" ({r['layer']})" if "layer" in r else ""))
            if rise > 0 and (best is None or rise > best[0]):
                best = (rise, p["delta_pct"], name)
    return best
