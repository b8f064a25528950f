"""Does memory held by tensors grow over the allocator's history, and which Python
lines hold on to what they allocated?

The state at every entry comes from the replay (allocator/replay.py): each device's
history replayed backwards from the snapshot's own state, reserved, active (rounded)
and requested bytes kept apart, every figure per device: the headline is one device
(the one whose reserved bytes peaked highest), and `devices` lists each. Trace
entries carry requested sizes, so the series' `active_bytes` are the blocks' rounded
sizes and `requested_bytes` the program's.

By stack: each `alloc` is paired with the next `free_completed` of the same device
and address; what is not freed by the end of the history is retained. A stack that
allocates on every iteration and never frees retains `retained_bytes_per_alloc` per
call: the planted leak of the real H200 snapshot, 16 MiB per iteration.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import polars as pl

from gputrace.analyses.allocator import ONE_PROCESS
from gputrace.analyses.allocator.device_replay import replay_devices
from gputrace.analyses.allocator.frames import with_labels
from gputrace.analyses.helpers.common import NS_PER_S
from gputrace.analyses.helpers.inputs import Inputs, trace_warnings
from gputrace.analyses.registry import unrecorded
from gputrace.analyses.report import Report
from gputrace.analyses.report_spec import ReportSpec

if TYPE_CHECKING:
    from gputrace.analyses.registry import Context


def _run(ctx: Context) -> Report:
    return growth(ctx.inp, ctx.opts.top)


SPEC = ReportSpec(
    "allocator-growth", "allocator_growth", "PyTorch allocator growth",
    "Does memory held by tensors grow over the allocator's history, and which Python "
    "lines keep what they allocate?",
    ("allocator",), _run,
    terminal="gputrace.render.allocator_sections:growth_section",
    html=("gputrace.render.allocator_html:growth_html",),
    fleet=ONE_PROCESS, place=90)
QUESTION = SPEC.question


MAX_POINTS = 400
"""Points of the active-bytes series per device; a longer history keeps every k-th
entry plus the entry at its peak and the last one."""


def retained_by_stack(inp: Inputs, per: pl.DataFrame) -> pl.DataFrame:
    """Per allocating stack (`per`: allocs, alloc_bytes, retained_count and
    retained_bytes, from the replay): the bytes retained per alloc and its labels."""
    per = per.with_columns(
        (pl.col("retained_bytes") / pl.col("allocs")).alias("retained_bytes_per_alloc"))
    return with_labels(inp, per.lazy()).sort(["retained_bytes", "allocs", "top_frame"],
                                             descending=[True, True, False]).collect()


def growth(inp: Inputs, top: int | None = None) -> Report:
    """The allocator growth report: active bytes over the history, retained by stack."""
    warnings = trace_warnings(inp)
    if (absent := unrecorded(SPEC, inp, warnings)) is not None:
        return absent
    # the replay once, over whole columns: the pairing by stack is part of it
    rep = replay_devices(inp, MAX_POINTS)
    stacks = retained_by_stack(inp, rep.by_stack)
    data: dict[str, Any] = {"entries": rep.entries, "by_stack": [], "series": [],
                            "devices": [], "device": None,
                            "start_active_bytes": None, "end_active_bytes": None,
                            "peak_active_bytes": None, "growth_bytes": None,
                            "growth_bytes_per_s": None, "span_s": None,
                            "start_reserved_bytes": None, "end_reserved_bytes": None,
                            "peak_reserved_bytes": None, "start_requested_bytes": None,
                            "end_requested_bytes": None, "peak_requested_bytes": None}
    if rep.entries == 0:
        warnings.append("allocator-growth: the snapshot holds no trace entries (history not "
                        "recorded: torch.cuda.memory._record_memory_history() before the run)")
        return Report("allocator-growth", QUESTION, True, data, [], warnings)
    devices = rep.devices
    for d in devices:
        if min(d["start_active_bytes"], d["start_reserved_bytes"],
               d["start_requested_bytes"]) < 0:
            warnings.append(f"allocator-growth: device {d['device']}'s trace entries do not "
                            "add up to the snapshot's segments (entries lost or a damaged "
                            "snapshot); its series is anchored at the snapshot and may be off")
    head = max(devices, key=lambda d: (d["peak_reserved_bytes"], d["peak_active_bytes"]))
    if len(devices) > 1:
        warnings.append(f"allocator-growth: {len(devices)} devices; every figure is one "
                        f"device's (`devices`), the headline device {head['device']}'s, whose "
                        "reserved bytes peaked highest")
    first_ts, last_ts = head["first_ts_ns"], head["last_ts_ns"]
    span_s = (last_ts - first_ts) / NS_PER_S if first_ts is not None else None
    grown = int(head["end_active_bytes"]) - int(head["start_active_bytes"])
    rows: list[dict[str, Any]] = stacks.to_dicts()
    data.update(
        {k: head[k] for k in head if k.endswith("_bytes")},
        device=head["device"], devices=devices, growth_bytes=grown, span_s=span_s,
        growth_bytes_per_s=grown / span_s if span_s else None,
        by_stack=rows[:top] if top is not None else rows,
        series=[{"t_s": None if r["ts_ns"] is None else (r["ts_ns"] - inp.start_ns) / NS_PER_S,
                 "entry": r["i"], "device": r["device"], "seq": r["seq"],
                 "action": r["action"], "active_bytes": r["active_bytes"],
                 "requested_bytes": r["requested_bytes"],
                 "reserved_bytes": r["reserved_bytes"]} for r in rep.series])
    return Report("allocator-growth", QUESTION, True, data, [], warnings)
