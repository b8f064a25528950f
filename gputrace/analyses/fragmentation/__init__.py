"""Is free GPU memory usable, or scattered into pieces too small to serve a 2 MiB chunk?

The report, from two sources, each its own part:

- RM samples (layer `rm_query`, table `gpu_memory`): per GPU over time, free
  memory, the largest free region and the share of free memory that a single
  allocation (or one of 2 MiB / 64 MiB / 1 GiB) cannot use; see
  gputrace.analyses.fragmentation.gpu_memory and rm_fragmentation.
- PMM chunks (layer `driver`): free space at peak use and at the end of the
  trace, per GPU (pmm_chunks) and within each reserved VA range of the API layer
  (va_reservations), measured by free_space.
"""

from __future__ import annotations

from typing import Any

from gputrace.analyses.fragmentation.pmm_chunks import chunk_section
from gputrace.analyses.fragmentation.rm_fragmentation import rm_section
from gputrace.analyses.helpers.inputs import Inputs, trace_warnings
from gputrace.analyses.registry import spec, unrecorded
from gputrace.analyses.report import Report

SPEC = spec("fragmentation")
QUESTION = SPEC.question


def fragmentation(inp: Inputs) -> Report:
    """The fragmentation report: RM samples (layer rm_query) and PMM chunks (driver)."""
    warnings = trace_warnings(inp)
    rm, pmm = inp.has("rm_query"), inp.has("driver")
    if (absent := unrecorded(SPEC, inp, warnings)) is not None:
        return absent
    data: dict[str, Any] = {"rm": rm_section(inp, warnings) if rm else None}
    if pmm:
        data.update(chunk_section(inp, warnings))
    else:
        data.update(gpus=None, reservations=None)
    missing = [x for x in SPEC.layers if not inp.has(x)]
    return Report("fragmentation", QUESTION, True, data, missing, warnings)
