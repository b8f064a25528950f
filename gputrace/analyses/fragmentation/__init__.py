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

from typing import TYPE_CHECKING, Any

from gputrace.analyses import fail_on
from gputrace.analyses.fragmentation.pmm_chunks import chunk_section
from gputrace.analyses.fragmentation.rm_fragmentation import rm_section
from gputrace.analyses.helpers.inputs import Inputs, trace_warnings
from gputrace.analyses.registry import unrecorded
from gputrace.analyses.report import Report
from gputrace.analyses.report_spec import FleetUse, Gate, ReportSpec

if TYPE_CHECKING:
    from gputrace.analyses.registry import Context


def _run(ctx: Context) -> Report:
    return fragmentation(ctx.inp)


SPEC = ReportSpec(
    "fragmentation", "fragmentation", "Fragmentation",
    "Is free GPU memory usable, or scattered into pieces too small for 2 MiB chunks?",
    ("driver", "rm_query"), _run,
    gates=(Gate("fragmentation", fail_on.fragmentation_hit, threshold=True),),
    terminal="gputrace.render.fault_fragmentation_sections:fragmentation_section",
    html=("gputrace.render.html_sections:fragmentation",),
    diff=(),  # per-GPU samples over time: no figure of one trace pairs with another's
    fleet=FleetUse(answers=("gpus",)), place=30)
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
