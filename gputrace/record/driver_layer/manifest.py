"""What the driver layer tells the trace manifest: its layers (`uvm_tools`,
`rm_query`), the tools queues' drop counts, the note on how UVM event times were
converted, the `driver_layer` facts (trackers, attach failures, tools ABI, RM
client, clock offsets) and the GPUs' UUIDs. docs/driver-layer.md lists the keys;
`poller.DriverPoller.manifest()` is the caller.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from gputrace.record.rm_query import client as rm_client
from gputrace.record.rm_query import sampler as memory_sampler
from gputrace.record.uvm_tools import abi as uvm_tools_abi
from gputrace.record.uvm_tools import gpu_uuids
from gputrace.record.uvm_tools import records as uvm_records
from gputrace.record.uvm_tools.target import TrackedProcess

if TYPE_CHECKING:
    from gputrace.record.driver_layer.poller import DriverPoller

CLOCK_NOTE = (
    "CLOCK_MONOTONIC_RAW converted to CLOCK_MONOTONIC by the piecewise-linear map through "
    "(raw, monotonic) points measured at start and after every drain"
)


def fragment(
    layer: DriverPoller, targets: Sequence[TrackedProcess], gpus: dict[bytes, int]
) -> dict[str, Any]:
    """Manifest fragment of `layer` whose trackers (open and closed) are `targets`
    and whose GPUs are `gpus` (UUID -> trace index): layers, drops, clock note,
    `driver_layer` facts, `gpu_uuids`."""
    drops: dict[str, int] = {}
    for code in uvm_tools_abi.EVENT_TYPES:
        name = uvm_records.EVENT_NAMES.get(code, str(code))
        drops[f"uvm_tools:{name}"] = sum(t.dropped[code] for t in targets)
    layers = []
    if targets:
        layers.append("uvm_tools")
    if layer.sampler is not None:
        layers.append("rm_query")
    bad = layer.bad_records()
    unmapped = sorted({u for t in targets for u in gpu_uuids.unmapped(t.table, gpus)})
    dl: dict[str, Any] = {
        "trackers_attached": sorted(t.pid for t in targets),
        "attach_failures": list(layer.failures),
        "missed_before_attach": list(layer.missed),
        "sample_interval_ms": layer.sample_ms,
        "pid_sample_interval_ms": layer.pid_sample_ms,
        "tools_abi": {
            "name": layer.abi.name,
            "queue_version": layer.abi.version,
            "entry_bytes": layer.abi.entry_size,
            "driver_layouts_of": layer.info.layout_version,
        },
        "queue_entries": layer.queue_entries,
        "drain_interval_ms": layer.drain_s * 1000.0,
        "bad_records": bad,
        "unmapped_processors": unmapped,
        "closed": [
            {"pid": t.pid, "closed_ts_ns": t.closed_ts_ns}
            for t in targets
            if t.closed_ts_ns is not None
        ],
        "rm_client": rm_facts(layer.rm, layer.rm_error, layer.sampler),
        "clock_offsets_ns": offsets_facts(layer.clock_offsets()),
    }
    if layer.error:
        dl["error"] = layer.error
    return {
        "layers": layers,
        "drops": drops,
        "clock": {"uvm_events": CLOCK_NOTE},
        "driver_layer": dl,
        "gpu_uuids": [
            {"index": i, "uuid": gpu_uuids.format_uuid(u)}
            for u, i in sorted(gpus.items(), key=lambda x: x[1])
        ],
    }


def offsets_facts(off: npt.NDArray[np.int64]) -> dict[str, int] | None:
    """First, last, min and max offset (mono - raw) of the clock map's points, and
    how many points it holds."""
    if not len(off):
        return None
    return {"first": int(off[0]), "last": int(off[-1]), "min": int(off.min()),
            "max": int(off.max()), "points": len(off)}


def rm_facts(
    rm: rm_client.RmClient | None, error: str | None, sampler: memory_sampler.MemorySampler | None
) -> dict[str, Any]:
    """The recorder's RM client: whether it opened (else why not), its GPUs and
    how each is queried, its notes, and how many memory samples it took (per period,
per process, for incidents)."""
    if rm is None:
        return {"open": False, "error": error}
    return {
        "open": True,
        "driver_reply": rm.driver_reply,
        "gpus": [
            {
                "index": g.gpu_index,
                "device_instance": g.device_instance,
                "uuid": gpu_uuids.format_uuid(g.uuid) if g.uuid else None,
                "query": "per-index" if g.per_index else "combined",
            }
            for g in rm.gpus
        ],
        "notes": list(rm.notes),
        "samples": sampler.samples if sampler else 0,
        "pid_samples": sampler.pid_samples if sampler else 0,
        "pid_query_failures": sampler.pid_failures if sampler else 0,
        "incident_samples": sampler.incident_samples if sampler else 0,
    }
