"""How is each value written in a terminal table cell? Bytes, counts, microseconds,
leak kinds, ids; None is always `-`. Formats only, computes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gputrace.units import format_bytes

Fmt = Callable[[Any], str]


def human_bytes(v: Any) -> str:
    return format_bytes(v)


def num(v: Any) -> str:
    """A value as the terminal writes it: counts with thousands separators, flags yes/no,
    a nested list or mapping as text (`a 1, b 2`), never Python's repr."""
    if v is None:
        return "-"
    if isinstance(v, dict):
        return ", ".join(f"{k} {nested(x, by_name(str(k)))}" for k, x in v.items()) or "-"
    if isinstance(v, (list, tuple)):
        return ", ".join(nested(x) for x in v) or "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def nested(v: Any, fmt: Fmt | None = None) -> str:
    """A value inside a list or mapping: a mapping in parentheses, the rest as `fmt`
    (from the key's name) or `num`."""
    return f"({num(v)})" if isinstance(v, dict) else (fmt or num)(v)


def by_name(key: str) -> Fmt:
    """How a column of a report without a section of its own is written, from its name:
    pids bare (1239, not 1,239), bytes in binary units, the rest as `num`."""
    if key == "pid" or key.endswith(("_pid", "pids")) or key in ("opened_by", "tid"):
        return pids
    return human_bytes if key.endswith("bytes") else num


def pids(v: Any) -> str:
    """A pid, or a list of them, bare (no thousands separator)."""
    if isinstance(v, (list, tuple)):
        return ", ".join(str(p) for p in v) or "-"
    return plain(v)


def us(v: Any) -> str:
    return "-" if v is None else f"{float(v) / 1000:,.1f}"


KIND_LABELS = {"alive_at_end": "alive", "unfreed_at_exit": "at exit"}


def short_kind(v: Any) -> str:
    return KIND_LABELS.get(str(v), str(v))


def plain(v: Any) -> str:
    return "-" if v is None else str(v)


def hexa(v: Any) -> str:
    return "-" if v is None else f"0x{int(v):x}"


def workload(row: dict[str, Any]) -> str:
    """Where a process ran, from its identity columns: `pod ml/trainer-0, container
    trainer`, `container 0123456789ab (docker)`, or "" on the host. The text is the
    trace's, untrusted: callers escape it for their medium."""
    if row.get("pod_uid") is not None:
        pod = (f"{row.get('pod_namespace')}/{row.get('pod_name')}"
               if row.get("pod_name") is not None else f"uid {row['pod_uid']}")
        name = row.get("container_name") or (row.get("container_id") or "")[:12]
        return f"pod {pod}" + (f", container {name}" if name else "")
    if row.get("container_id") is not None:
        runtime = row.get("container_runtime")
        return f"container {row['container_id'][:12]}" + (f" ({runtime})" if runtime else "")
    return ""
