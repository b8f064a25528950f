"""Which tensors are still alive, and which Python lines made them?

The leak report in tensor terms, from the allocator layer (a PyTorch memory snapshot,
`gputrace import torch-snapshot`): every active block of the caching allocator when
the snapshot was taken is a tensor's memory (or one freed by the program that another
stream still uses: `active_pending_free`). Grouped by the Python stack that allocated
it, largest first. The API layer sees only the segments the tensors live in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import polars as pl

from gputrace.analyses.allocator import ONE_PROCESS
from gputrace.analyses.allocator.frames import with_labels
from gputrace.analyses.helpers.inputs import Inputs, trace_warnings
from gputrace.analyses.registry import unrecorded
from gputrace.analyses.report import Report
from gputrace.analyses.report_spec import DiffTable, ReportSpec

if TYPE_CHECKING:
    from gputrace.analyses.registry import Context


def _run(ctx: Context) -> Report:
    return tensors(ctx.inp, ctx.opts.top)


SPEC = ReportSpec(
    "tensors", "tensors", "Tensors alive (PyTorch)",
    "Which tensors are still alive, and which Python lines allocated them?",
    ("allocator",), _run,
    terminal="gputrace.render.allocator_sections:tensors_section",
    html=("gputrace.render.allocator_html:tensors_html",),
    diff=(DiffTable("tensors", "Tensors alive (PyTorch)", (), ("field",), ("value",)),
          DiffTable("tensor_sites", "Tensors alive by site (new, gone, grown)",
                    ("by_stack",), ("device", "site"), ("bytes", "count"),
                    is_bytes=True)),
    fleet=ONE_PROCESS, place=70)
QUESTION = SPEC.question




def alive_blocks(inp: Inputs) -> pl.LazyFrame:
    """The active blocks (allocated or pending free) of the snapshot."""
    return inp.scan("allocator_blocks").filter(pl.col("state") != "inactive")


def tensors(inp: Inputs, top: int | None = None) -> Report:
    """The tensors report: alive tensors by allocating stack, and their totals."""
    warnings = trace_warnings(inp)
    if (absent := unrecorded(SPEC, inp, warnings)) is not None:
        return absent
    alive = alive_blocks(inp)
    by_stack = with_labels(inp, alive.group_by("pid", "device", "stack_id").agg(
        pl.len().alias("count"), pl.col("size_bytes").sum().alias("bytes"),
        pl.col("requested_size_bytes").sum().alias("requested_bytes"),
        (pl.col("state") == "active_pending_free").sum().alias("pending_free"),
    )).sort(["bytes", "count", "top_frame"], descending=[True, True, False])
    totals = alive.select(
        pl.len().alias("count"), pl.col("size_bytes").sum().alias("bytes"),
        (pl.col("state") == "active_pending_free").sum().alias("pending_free_count"),
        pl.col("size_bytes").filter(pl.col("state") == "active_pending_free").sum()
        .alias("pending_free_bytes"))
    stacks, tot = pl.collect_all([by_stack, totals])
    rows: list[dict[str, Any]] = stacks.to_dicts()
    t = tot.row(0, named=True)
    if not rows and t["count"] == 0:
        warnings.append("tensors: the snapshot holds no active blocks")
    data = {
        "total_count": int(t["count"]), "total_bytes": int(t["bytes"] or 0),
        "pending_free_count": int(t["pending_free_count"]),
        "pending_free_bytes": int(t["pending_free_bytes"] or 0),
        "by_stack": rows[:top] if top is not None else rows,
        "stacks": len(rows),
    }
    if rows and not any(s["frames"] for s in rows):
        warnings.append("tensors: the snapshot holds no stacks (history not recorded: "
                        "torch.cuda.memory._record_memory_history() before the run)")
    return Report("tensors", QUESTION, True, data, [], warnings)
