"""What changed between two traces of the same job?

Input: each trace's report document (`analyze --format json`) and its leaked
bytes by call stack (`stacks_by_bytes.folded_stacks`). Process ids differ from run
to run, so processes are matched by (layer, comm) and leak sites by (layer,
comm, frames); GPUs by index; fault rates by (source, access type, GPU);
ioctl commands by (name, device, GPU). Which tables there are, and what each
matches and compares, is each report's registry entry (`ReportSpec.diff`); a report
that declares none is compared on its top-level figures, and one that declares `()` is
listed in `not_compared`. Only what differs is listed: two traces of identical
behaviour give `changed: false` and empty lists. A row's status says which way its
first figure moved: new, gone, grown, shrunk (or changed). Two traces whose leaks were
measured in different layers (a syscall-only trace counts driver bytes, an API trace
API bytes) are said to be so (`leak_layers.mismatch`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from gputrace.analyses import registry
from gputrace.analyses.report import REPORT_FIELDS
from gputrace.analyses.report_spec import DiffTable, ReportSpec

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
        diffs = {f: _delta((b or {}).get(f), (a or {}).get(f)) for f in fields}
        first = diffs[fields[0]]["delta"] if fields else None
        status = ("new" if b is None else "gone" if a is None
                  else "grown" if isinstance(first, (int, float)) and first > 0
                  else "shrunk" if isinstance(first, (int, float)) and first < 0 else "changed")
        if status in ("changed", "grown", "shrunk") and all(d["delta"] in (0, None) and
                                       (b or {}).get(f) == (a or {}).get(f)
                                       for f, d in diffs.items()):
            continue
        rows.append({**dict(zip(names, k, strict=True)), "status": status, **diffs})
    return rows


LEAK_LAYERS = ("api", "syscall")
"""The layers whose allocations the leak report counts, in the order it prefers them: API
bytes where the API layer was recorded, else driver (RM) bytes from the syscall layer."""


def leak_layers(doc: dict[str, Any]) -> list[str] | None:
    """The layer a trace's leaked bytes were measured in, as a list (empty: neither);
    None: its leak report was not recorded."""
    leaks = doc.get("leaks") or {}
    if not leaks.get("recorded"):
        return None
    layers = (doc.get("trace") or {}).get("layers") or []
    return [x for x in LEAK_LAYERS if x in layers][:1]


def layer_mismatch(before: dict[str, Any], after: dict[str, Any]) -> str | None:
    """Why the two traces' leaks do not compare (measured in different layers: API bytes
    against driver bytes), or None when they do."""
    b, a = leak_layers(before), leak_layers(after)
    if b is None or a is None or b == a:
        return None

    def what(layers: list[str]) -> str:
        return (f"{'+'.join(layers)} ("
                + ("API allocation bytes" if "api" in layers else "driver (RM) bytes") + ")")
    return (f"the traces measured leaks in different layers: before {what(b)}, after "
            f"{what(a)}; leaked bytes, leak sites and peaks per layer do not compare")


def _leak_total(doc: dict[str, Any]) -> int | None:
    leaks = doc.get("leaks") or {}
    return leaks.get("total_bytes") if leaks.get("recorded") else None


def tables() -> list[tuple[ReportSpec, DiffTable]]:
    """Every table of the diff document with its report, in registry order: each report's
    declared tables, and for a report that declares none its top-level figures (path
    `()`, one row per figure)."""
    return [(spec, t) for spec in registry.REPORTS
            for t in (spec.diff if spec.diff is not None
                      else (DiffTable(spec.key, spec.title, (), ("field",), ("value",)),))]


def not_compared() -> list[str]:
    """The reports `gputrace diff` does not compare (their entries say so)."""
    return [s.name for s in registry.REPORTS if s.diff == ()]


def _rows(spec: ReportSpec, t: DiffTable, doc: dict[str, Any],
          stacks: list[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    """Table `t`'s rows of one trace, by key."""
    if t.path == ("@stacks",):
        # matched by site (the first frame of the user's code): the same line is one row
        rows: Any = [dict(r, stack=r.get("site") or " < ".join(r["frames"][::-1]))
                     for r in stacks]
    else:
        rows = doc.get(spec.key) or {}
        if not t.path:  # the report's own figures, one row each
            return {(k,): {"value": v} for k, v in rows.items() if k not in REPORT_FIELDS
                    and isinstance(v, (int, float)) and not isinstance(v, bool)}
        for step in t.path:
            rows = (rows or {}).get(step)
    rows = rows or []
    if not t.add_up:  # several rows of one key never occur there; no sums of quantiles
        return {tuple(r.get(k) for k in t.keys): {f: r.get(f) for f in t.fields}
                for r in rows}
    return _index(rows, lambda r: tuple(r.get(k) for k in t.keys),
                  lambda r: {f: r.get(f) for f in t.fields})


def diff(before: dict[str, Any], after: dict[str, Any], before_stacks: list[dict[str, Any]],
         after_stacks: list[dict[str, Any]]) -> dict[str, Any]:
    """The changes from `before` to `after` (report documents and their leak stacks)."""
    out: dict[str, Any] = {"leak_bytes": _delta(_leak_total(before), _leak_total(after))}
    names = []
    for spec, t in tables():
        out[t.name] = _compare(t.keys, _rows(spec, t, before, before_stacks),
                               _rows(spec, t, after, after_stacks), t.fields)
        names.append(t.name)
    lb = out["leak_bytes"]
    out["changed"] = bool(lb["delta"] or lb["before"] != lb["after"]
                          or any(out[n] for n in names))
    out["not_compared"] = not_compared()
    out["leak_layers"] = {"before": leak_layers(before), "after": leak_layers(after),
                          "mismatch": layer_mismatch(before, after)}
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
