"""What did the GPU look like when an allocation failed?

- Free memory (`gpu_memory`, layer rm_query): the sample the recorder took for the
  incident (trigger `incident`, the first after the failed call returned, within
  `INCIDENT_MAX_NS`), else the nearest usable sample in time, with its distance.
- Who held it by the driver's own accounting (`gpu_process_memory`): the query round
  nearest the failure (an incident round after it first), every process RM named.
- What caching allocators held reserved but unallocated (allocator layer): the state of
  the snapshot rolled back to the instant by the trace entries after it (a segment
  allocated after the instant was not reserved yet; a block freed after it was still
  allocated), per process and CUDA device (taken as the trace's GPU index).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from gputrace.analyses.helpers.inputs import Inputs

INCIDENT_MAX_NS = 1_000_000_000
"""An incident sample later than this after the failure belongs to another one."""
ROUND_NS = 50_000_000
"""Per-process rows of one query round are this close in time."""



def _pick(rows: pl.DataFrame, at_ns: int) -> dict[str, Any] | None:
    """The incident row right after `at_ns`, else the row nearest to it."""
    if rows.height == 0:
        return None
    after = rows.filter((pl.col("trigger") == "incident") & (pl.col("ts_ns") >= at_ns)
                        & (pl.col("ts_ns") <= at_ns + INCIDENT_MAX_NS)).sort("ts_ns")
    if after.height:
        return after.row(0, named=True)
    near = rows.with_columns((pl.col("ts_ns") - at_ns).abs().alias("_d")).sort("_d", "ts_ns")
    return near.row(0, named=True)


def memory_samples(inp: Inputs) -> pl.DataFrame:
    """Usable free-memory samples (query succeeded, sizes present)."""
    return (inp.scan("gpu_memory")
            .filter((pl.col("status") == 0) & pl.col("heap_free_bytes").is_not_null())
            .select("ts_ns", "gpu_index", "heap_size_bytes", "heap_free_bytes",
                    "largest_free_bytes", "trigger", "delay_ns").collect())


def gpu_at(samples: pl.DataFrame, gpu: int, at_ns: int) -> dict[str, Any] | None:
    """The GPU's memory at `at_ns`: total, free, largest free, from which sample."""
    s = _pick(samples.filter(pl.col("gpu_index") == gpu), at_ns)
    if s is None:
        return None
    return {"total_bytes": s["heap_size_bytes"], "free_bytes": s["heap_free_bytes"],
            "largest_free_bytes": s["largest_free_bytes"], "sample_ts_ns": s["ts_ns"],
            "sample_trigger": s["trigger"], "sample_distance_ns": s["ts_ns"] - at_ns,
            "sample_delay_ns": s["delay_ns"]}


def allocator_said(free: int | None) -> dict[str, Any] | None:
    """The GPU as an allocator's `oom` entry saw it, without an RM sample: the free
    memory CUDA reported to it (no total, no largest free region)."""
    if free is None:
        return None
    return {"total_bytes": None, "free_bytes": free, "largest_free_bytes": None,
            "sample_ts_ns": None, "sample_trigger": "allocator", "sample_distance_ns": 0,
            "sample_delay_ns": None}


def why_no_sample(inp: Inputs, samples: pl.DataFrame, gpu: int | None) -> str:
    """Which layer or fact is missing when a failure has no free-memory sample."""
    if gpu is None:
        # no GPU listed (a host recording without the driver layer) is not "several"
        n = len(inp.gpu_memory_bytes)
        return ("which GPU: the failing call does not say, and the trace "
                + (f"has {n} GPUs" if n else "lists no GPU"))
    if not inp.has("rm_query"):
        return f"layer rm_query not recorded: no free-memory sample of GPU {gpu}"
    tried = inp.scan("gpu_memory").filter(pl.col("gpu_index") == gpu).select(
        pl.len()).collect().item()
    return (f"layer rm_query recorded, but no usable sample of GPU {gpu} "
            f"({tried} queries, none answered with sizes)")


def driver_round(inp: Inputs, gpu: int, at_ns: int) -> tuple[dict[str, Any] | None,
                                                              dict[int, int | None]]:
    """(when and why the round was taken, bytes per pid) of the driver's per-process
    accounting nearest `at_ns` on `gpu`; (None, {}) when none was recorded."""
    rows = (inp.scan("gpu_process_memory").filter(pl.col("gpu_index") == gpu)
            .select("ts_ns", "pid", "vidmem_bytes", "trigger").collect())
    first = _pick(rows, at_ns)
    if first is None:
        return None, {}
    trig = first["trigger"]
    same = rows.filter(pl.col("trigger") == trig)
    # the nearest row may be a later one of its round (the recorder stamps each batch of
    # pids it asks about): the round starts at its earliest row, at most ROUND_NS before
    t1 = int(first["ts_ns"])
    t0 = int(same.filter((pl.col("ts_ns") > t1 - ROUND_NS)
                         & (pl.col("ts_ns") <= t1))["ts_ns"].min())  # type: ignore[arg-type]
    rnd = same.filter((pl.col("ts_ns") >= t0) & (pl.col("ts_ns") < t0 + ROUND_NS)).sort("ts_ns")
    by_pid: dict[int, int | None] = {}
    for pid, b in zip(rnd["pid"], rnd["vidmem_bytes"], strict=True):
        by_pid.setdefault(int(pid), None if b is None else int(b))
    return {"ts_ns": t0, "trigger": trig, "distance_ns": t0 - at_ns}, by_pid


def allocator_at(inp: Inputs, gpu: int, at_ns: int | None) -> dict[int, tuple[int, int]] | None:
    """Per pid, (reserved, active) bytes of its caching allocator on `gpu` at `at_ns`
    (the allocator replay: the snapshot's state with the entries after `at_ns`
    undone); None without the allocator layer. Reserved minus active is what the
    cache held free."""
    if not inp.has("allocator"):
        return None
    from gputrace.analyses.allocator.replay import state_by_pid

    return state_by_pid(inp, gpu, at_ns)
