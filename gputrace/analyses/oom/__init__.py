"""Why did an allocation fail for want of memory, and who held the GPU when it did?

One incident per failed allocation whose status means "no memory" in any layer
(`failures`; a failure two layers saw and a retry loop are one incident each): when,
which process and thread, which GPU, the requested size and call stack; the GPU at
that instant (`gpu_state`: total, free, largest free region, from the sample taken
for the incident, else the nearest with its distance); the verdict with its evidence
(`gputrace.oom_rules`, the recorder's rule too: capacity, fragmentation, allocator
pool, limit or unknown); and every process holding that GPU (`holders`: the driver's
accounting beside the recorded layers, top live sites, growth over the window).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from gputrace import oom_rules
from gputrace.analyses import fail_on
from gputrace.analyses.allocator.oom_state import oom_states
from gputrace.analyses.helpers.common import NS_PER_S
from gputrace.analyses.helpers.inputs import Inputs, trace_warnings
from gputrace.analyses.oom import failures, gpu_state, identity
from gputrace.analyses.oom.holders import Recorded, holders
from gputrace.analyses.registry import unrecorded
from gputrace.analyses.report import Report
from gputrace.analyses.report_spec import DiffTable, FleetUse, Gate, ReportSpec

if TYPE_CHECKING:
    from gputrace.analyses.registry import Context


def _run(ctx: Context) -> Report:
    return oom(ctx.inp, ctx.opts.oom_window_s, ctx.opts.top, ctx.opts.by)


SPEC = ReportSpec(
    "oom", "oom", "Out of memory",
    "Why did an allocation fail for want of memory: was the GPU full, fragmented, held "
    "by an allocator's cache or limited, and who held it at that instant?",
    ("api", "syscall", "allocator"), _run,
    gates=(Gate("oom", fail_on.oom_hit),),
    unrecorded_data={"incidents": [], "count": None},
    terminal="gputrace.render.oom_sections:oom_section",
    html=("gputrace.render.html_sections:oom",),
    diff=(DiffTable("oom_verdicts", "Out-of-memory incidents by verdict", ("by_verdict",),
                    ("verdict",), ("incidents", "failures", "requested_bytes"),
                    shown=("incidents", "failures")),),
    fleet=FleetUse(sums=("count", "failures")), place=40)
QUESTION = SPEC.question


def _stack(inp: Inputs, rec: Recorded, f: dict[str, Any]) -> str | None:
    """The failing call's stack as text (an allocator entry's from its own frames)."""
    if f["layer"] != "allocator":
        return rec.stack(f["pid"], f["stack_id"])
    if f["stack_id"] is None:
        return None
    import polars as pl

    from gputrace.analyses.allocator.frames import frame_label

    got = (inp.scan("allocator_frames").filter(pl.col("stack_id") == f["stack_id"])
           .sort("depth").select(frame_label().alias("f")).collect())
    return " < ".join(got["f"]) if got.height else None


def _incident(inp: Inputs, rec: Recorded, samples: Any, f: dict[str, Any], window_ns: int,
              top: int | None, states: dict[tuple[Any, Any], list[dict[str, Any]]]
              ) -> dict[str, Any]:
    at, gpu = f["end_ns"], f["gpu_index"]
    entry = f if f["layer"] == "allocator" else f["allocator_entry"]
    mine = states.get((gpu, entry["ts_ns"])) if entry is not None else None
    allocator_state = mine.pop(0) if mine else None
    timed = gpu is not None and at is not None  # a PyTorch 2.1 entry has no time
    state = gpu_state.gpu_at(samples, gpu, at) if timed else None
    if state is None:  # the allocator's own entry says what CUDA reported free
        said = f if f["layer"] == "allocator" else f["allocator_entry"] or {}
        state = gpu_state.allocator_said(said.get("device_free_bytes"))
    missing = None if state is not None else gpu_state.why_no_sample(inp, samples, gpu)
    alloc = gpu_state.allocator_at(inp, gpu, at) if gpu is not None else None
    pool = None if alloc is None else sum(r - a for r, a in alloc.values())
    if allocator_state is not None:  # the failing allocator's own cache, at its entry
        pool = allocator_state["cache_free_bytes"]
    v = oom_rules.judge(f["size_bytes"], (state or {}).get("free_bytes"),
                        (state or {}).get("largest_free_bytes"), pool, missing)
    driver_at, driver = (gpu_state.driver_round(inp, gpu, at) if timed else (None, {}))
    listed, left_out = (holders(rec, gpu, at, window_ns, driver, alloc, top)
                        if timed else ([], None))
    entry = f["allocator_entry"]
    return {
        "allocator_state": allocator_state,
        "ts_ns": f["ts_ns"],
        "t_s": None if f["ts_ns"] is None else (f["ts_ns"] - inp.start_ns) / NS_PER_S,
        "pid": f["pid"], "tid": f["tid"], "comm": f["comm"] or rec.comm.get(f["pid"]),
        "layer": f["layer"], "call": f["call"], "status": f["status"],
        "gpu_index": gpu, "gpu_from": f.get("gpu_from"),
        "requested_bytes": f["size_bytes"], "attempts": f["attempts"],
        "last_ts_ns": f["last_ts_ns"],
        "nested": [{"layer": n["layer"], "call": n["call"], "status": n["status"],
                    "ts_ns": n["ts_ns"]} for n in f["nested"]],
        "allocator_entry": None if entry is None else {
            "ts_ns": entry["ts_ns"], "requested_bytes": entry["size_bytes"]},
        "stack": _stack(inp, rec, f),
        "gpu": state, "allocator_pool_bytes": pool,
        "verdict": v.name, "evidence": v.evidence,
        "driver_accounting": driver_at,
        "holders": listed, "holders_left_out": left_out,
    }


def oom(inp: Inputs, window_s: float = 30.0, top: int | None = None,
        by: str | None = None) -> Report:
    """The oom report: every out-of-memory incident, its verdict and the GPU's holders;
    `by`: incidents also added up per "pod" or "container" of the failing process."""
    warnings = trace_warnings(inp)
    if (absent := unrecorded(SPEC, inp, warnings)) is not None:
        return absent
    found = failures.incidents(inp)
    incidents: list[dict[str, Any]] = []
    if found:
        rec = Recorded(inp)
        samples = gpu_state.memory_samples(inp)
        window_ns = round(window_s * NS_PER_S)
        states: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
        for st in oom_states(inp):
            states.setdefault((st["device"], st["ts_ns"]), []).append(st)
        incidents = [_incident(inp, rec, samples, f, window_ns, top, states) for f in found]
        identity.name_them(inp, incidents)
        if inp.has("syscall") or inp.has("rm_query"):
            from gputrace.analyses.holders import Facts, instants_report

            # who held the device files then, and memory no live process owned
            owners = instants_report(Facts(inp), [("incident", int(f["end_ns"]), f["gpu_index"])
                                                  for f in found])
            for inc, own in zip(incidents, owners, strict=True):
                inc["no_live_owner"] = own
    per_verdict = Counter(i["verdict"] for i in incidents)
    data: dict[str, Any] = {
        "window_s": window_s,
        "count": len(incidents),
        "failures": sum(i["attempts"] for i in incidents),
        "by_verdict": [
            {"verdict": v, "incidents": per_verdict[v],
             "failures": sum(i["attempts"] for i in incidents if i["verdict"] == v),
             "requested_bytes": sum(i["requested_bytes"] or 0 for i in incidents
                                    if i["verdict"] == v)}
            for v in oom_rules.VERDICTS if per_verdict[v]],
        "incidents": incidents,
    }
    if by is not None:
        data[f"by_{by}"] = identity.by_group(inp, incidents, by)
    return Report("oom", QUESTION, True, data, [], warnings)
