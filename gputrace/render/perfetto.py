"""The trace as a native Perfetto protobuf trace (`--format perfetto`).

What goes on which track (this module); how tracks and rows are written
(perfetto_writer, perfetto_wire). Layout:

- a process track per pid and a thread track per (pid, tid); CUDA calls are
  slices on the thread track, ioctls slices on an "ioctls" child track of the
  thread (a CUDA call contains the ioctls it makes, so separate tracks keep
  both nestings valid); a call without latency is an instant;
- instant events for faults (a "faults" track per process) and migrations
  (one global track);
- counter tracks: live bytes per (layer, process), bytes in use per GPU, and
  faults / batches / migrations per second.

Timestamps are the trace's CLOCK_MONOTONIC nanoseconds, written without a clock
id, so Perfetto shows them as the trace's own clock.
"""

from __future__ import annotations

from typing import Any, BinaryIO

import polars as pl

from gputrace.render.perfetto_writer import Writer, track_uuid


def render_perfetto(tl: dict[str, Any], out: BinaryIO) -> int:
    """Write the timeline `tl` (`analyses.timeseries.timeline`) as a Perfetto trace;
    returns the number of packets written."""
    w = Writer(out)
    procs: set[int] = set()

    def process(pid: int, name: str | None) -> int:
        if pid not in procs:
            procs.add(pid)
            w.track(track_uuid("p", pid), process={"pid": pid, "process_name": name or str(pid)})
        return track_uuid("p", pid)

    for t in tl["threads"].collect().iter_rows(named=True):
        proc = process(t["pid"], t["process"] or t["comm"])
        thread = track_uuid("t", t["pid"], t["tid"])
        w.track(thread, parent=proc, thread={"pid": t["pid"], "tid": t["tid"],
                                             "thread_name": t["comm"] or str(t["tid"])})
        w.track(track_uuid("io", t["pid"], t["tid"]), "ioctls", thread)

    w.rows(tl["ioctls"], pl.col("name"), lambda k: track_uuid("io", *k), ("pid", "tid"),
           ("size_bytes", "handle", "status", "ret", "latency_ns", "gpu_index"), True)
    w.rows(tl["cuda_calls"], pl.col("func"), lambda k: track_uuid("t", *k), ("pid", "tid"),
           ("size_bytes", "ptr", "handle", "result", "latency_ns"), True)

    fault_pids = tl["faults"].select("pid").unique().sort("pid").collect()["pid"].to_list()
    for pid in fault_pids:
        w.track(track_uuid("f", pid), "faults", process(pid, None))
    w.rows(tl["faults"], pl.format("fault {} {}", *(pl.col(c).cast(pl.String).fill_null(
        "None") for c in ("source", "access_type"))), lambda k: track_uuid("f", *k), ("pid",),
        ("address", "gpu_index"), False)
    mig = track_uuid("migrations")
    w.track(mig, "migrations")
    w.rows(tl["migrations"], pl.format("migration {}", pl.col("cause").cast(pl.String)
                                       .fill_null("None")),
           lambda k: mig, (), ("src", "dst", "size_bytes", "address", "pid"), False)
    _counters(w, tl, process)
    return w.packets


def _counters(w: Writer, tl: dict[str, Any], process: Any) -> None:
    bytes_unit = w.pb.CounterDescriptor.UNIT_SIZE_BYTES
    points: list[tuple[int, list[float], list[Any]]] = []

    def series(uuid: int, name: str, parent: int | None, s: dict[str, Any], key: str,
               unit: int | None) -> None:
        w.track(uuid, name, parent, counter={"unit": unit} if unit else {})
        points.append((uuid, s["t_s"], s[key]))

    for s in tl["live_bytes"]["series"]:
        series(track_uuid("live", s["layer"], s["pid"]), f"live bytes {s['layer']}",
               process(s["pid"], None), s, "values", bytes_unit)
    for s in tl["gpu_bytes"]["series"]:
        series(track_uuid("gpu", s["gpu_index"]), f"GPU {s['gpu_index']} bytes in use", None, s,
               "values", bytes_unit)
    for key, part in tl["fault_rates"].items():
        if not isinstance(part, dict) or not part["recorded"]:
            continue
        for s in part["series"]:
            name = f"{key} per s" + (f" {s['name']}" if s["name"] else "")
            series(track_uuid("rate", key, s["name"]), name, None, s, "per_s", None)
    # every counter track is described above; their values follow in one encoding pass
    w.counters(points, tl.get("start_ns", 0))
