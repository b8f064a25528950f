"""The one list of `gputrace analyze` reports, and what each one is.

`REPORTS` is read by everything that enumerates reports: the CLI (`--only` names,
`--fail-on` conditions), the JSON document (one key per report), the "not recorded"
report (`unrecorded`, from each entry's layers), the terminal and HTML renderers (each
entry's sections, or the generic one), `gputrace diff` (each entry's tables), `fleet
analyze` (what each entry aggregates, or why not), the tests and
benchmarks/analyze/bench.py. Adding a report is one entry here plus its own module;
nothing else enumerates reports.

Spellings: `name` is the CLI spelling (`--only fault-rate`, docs/analyses/<name>.md);
`key` is the report's key in the JSON document, a stable contract (docs/json-report.md):
`fault-rate` is `fault_rate` there; this is the one place that maps one to the other.

What a report is (`ReportSpec`, `Gate`, `ReportOptions`) is in report_spec, the
`--fail-on` conditions in fail_on. The analyses are imported when a report runs, so
the CLI can read the list without loading polars.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gputrace.analyses import fail_on
from gputrace.analyses.report_spec import DiffTable, FleetUse, Gate, ReportOptions, ReportSpec

if TYPE_CHECKING:
    from gputrace.analyses.helpers.inputs import Inputs
    from gputrace.analyses.helpers.partition import Slice
    from gputrace.analyses.report import Report


class Context:
    """What a report's steps see while `run_reports` runs: the trace's inputs, the
    options, the reports asked for, values shared between reports (`memo`) and the
    per-pid-slice parts (`parts`), computed in one pass for every report that has one."""

    def __init__(self, inp: Inputs, opts: ReportOptions, names: list[str]) -> None:
        self.inp = inp
        self.opts = opts
        self.names = names
        self._memo: dict[str, Any] = {}
        self._parts: dict[str, list[Any]] | None = None

    def memo(self, key: str, make: Callable[[], Any]) -> Any:
        """`make()`, computed once per run under `key`."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    def parts(self, name: str) -> list[Any]:
        """Report `name`'s part of each pid slice. The first call makes one pass over the
        slices for every asked-for report with a `part` step: they share each slice's
        lifetimes."""
        if self._parts is None:
            from gputrace.analyses.helpers.partition import per_slice

            steps: dict[str, Callable[[Slice], Any]] = {
                s.name: functools.partial(s.part, self)
                for s in selected(self.names) if s.part is not None}
            self._parts = per_slice(self.inp, steps)
        return self._parts[name]


# ---- the reports' steps (imports on first use: see the module docstring)


def _leak_options(ctx: Context) -> Any:
    from gputrace.analyses.leaks import LeakOptions

    o = ctx.opts
    return ctx.memo("leak_options", lambda: LeakOptions(o.older_ns, o.min_size, o.top, o.by))


_HELD_COLUMNS = ("processes", "held_bytes", "program_bytes", "allocator_pool_bytes",
                 "cuda_context_bytes", "driver_only_bytes", "pieces", "api_layer_bytes",
                 "rm_layer_bytes", "uvm_layer_bytes")
"""`leaks --by pod|container`: each group's held figure (one per process, added over its
processes: leaks/held_end.py), its classes, then the per-layer breakdown."""
_SUMMARY_HELD = ("processes", "live_end_bytes", "sum_of_peaks_bytes", "program_bytes",
                 "allocator_pool_bytes", "cuda_context_bytes", "driver_only_bytes", "pieces",
                 "api_layer_live_end_bytes", "rm_layer_live_end_bytes",
                 "uvm_layer_live_end_bytes")
"""`summary --by pod|container`: what the group held at the end (one figure per process,
the joined model: summary.held_memory), its processes' peaks added, its classes, then
what each layer alone showed at the end (a breakdown)."""


def _leaks_part(ctx: Context, sl: Slice) -> Any:
    from gputrace.analyses.leaks import leak_part

    return leak_part(sl, _leak_options(ctx))


def _leaks(ctx: Context) -> Report:
    from gputrace.analyses.leaks import leaks

    return leaks(ctx.inp, _leak_options(ctx), ctx.parts("leaks"))


def _pmm(ctx: Context) -> Any:
    from gputrace.analyses.helpers.gpus import pmm_gpus

    return ctx.memo("pmm_gpus", lambda: pmm_gpus(ctx.inp))


def _summary_part(ctx: Context, sl: Slice) -> Any:
    from gputrace.analyses.summary import summary_part

    return summary_part(sl, _pmm(ctx) is None)


def _summary(ctx: Context) -> Report:
    from gputrace.analyses.summary import summary

    return summary(ctx.inp, ctx.parts("summary"), _pmm(ctx), ctx.opts.by)


def _fault_rate(ctx: Context) -> Report:
    from gputrace.analyses.fault_rate import fault_rate

    o = ctx.opts
    return fault_rate(ctx.inp, window_s=o.window_s, min_reversals=o.thrash_min, top=o.top,
                      by=o.by)


def _fragmentation(ctx: Context) -> Report:
    from gputrace.analyses.fragmentation import fragmentation

    return fragmentation(ctx.inp)


_SECTIONS = "gputrace.render.html_sections"

def _tensors(ctx: Context) -> Report:
    from gputrace.analyses.allocator.tensors import tensors

    return tensors(ctx.inp, ctx.opts.top)


def _allocator_pool(ctx: Context) -> Report:
    from gputrace.analyses.allocator.pool import pool

    return pool(ctx.inp, ctx.opts.top)


def _allocator_growth(ctx: Context) -> Report:
    from gputrace.analyses.allocator.growth import growth

    return growth(ctx.inp, ctx.opts.top)


def _oom(ctx: Context) -> Report:
    from gputrace.analyses.oom import oom

    return oom(ctx.inp, ctx.opts.oom_window_s, ctx.opts.top, ctx.opts.by)


def _holders(ctx: Context) -> Report:
    from gputrace.analyses.holders import holders

    return holders(ctx.inp)


_ONE_PROCESS = FleetUse(why_not="a PyTorch snapshot describes one process's allocator: "
                                "its blocks and lines do not add up across hosts")

REPORTS: list[ReportSpec] = [
    ReportSpec(
        "leaks", "leaks", "Leaks",
        "What memory was never freed, by whom, and is any process's memory growing?",
        ("api", "syscall"), _leaks, _leaks_part,
        (Gate("leaks", fail_on.leaks_hit), Gate("growth", fail_on.growth_hit)),
        unrecorded_data={"allocations": [], "total_bytes": None},
        terminal="gputrace.render.leak_sections:leaks_section",
        terminal_by_layer="gputrace.render.leak_sections:leaks_by_layer_section",
        html=(f"{_SECTIONS}:live_bytes", f"{_SECTIONS}:active_memory",
              f"{_SECTIONS}:leak_sites"),
        diff=(DiffTable("leak_sites", "Leak sites (leaked bytes by call stack)", ("@stacks",),
                        ("layer", "comm", "stack"), ("bytes", "count"), is_bytes=True),),
        columns={"by_pod": ("pod_namespace", "pod_name", *_HELD_COLUMNS, "pod_uid",
                            "qos_class"),
                 "by_container": ("pod_namespace", "pod_name", "container_name",
                                  *_HELD_COLUMNS, "container_id", "container_runtime",
                                  "pod_uid")},
        fleet=FleetUse(answers=("leaks", "holders"))),
    ReportSpec(
        "fault-rate", "fault_rate", "Fault rate",
        "How often does managed memory fault, and does it thrash or oversubscribe the GPU?",
        ("cpu_faults", "driver", "uvm_tools"), _fault_rate,
        gates=(Gate("thrashing", fail_on.thrashing_hit, blind=fail_on.thrashing_blind),),
        terminal="gputrace.render.fault_fragmentation_sections:fault_rate_section",
        html=(f"{_SECTIONS}:fault_rate",),
        diff=(DiffTable("fault_rates", "Fault rates", ("rates",),
                        ("source", "access_type", "gpu_index"),
                        ("faults", "mean_per_s", "peak_per_s")),),
        fleet=FleetUse(answers=("gpus", "fault_rate"))),
    ReportSpec(
        "fragmentation", "fragmentation", "Fragmentation",
        "Is free GPU memory usable, or scattered into pieces too small for 2 MiB chunks?",
        ("driver", "rm_query"), _fragmentation,
        gates=(Gate("fragmentation", fail_on.fragmentation_hit, threshold=True),),
        terminal="gputrace.render.fault_fragmentation_sections:fragmentation_section",
        html=(f"{_SECTIONS}:fragmentation",),
        diff=(),  # per-GPU samples over time: no figure of one trace pairs with another's
        fleet=FleetUse(answers=("gpus",))),
    ReportSpec(
        "oom", "oom", "Out of memory",
        "Why did an allocation fail for want of memory: was the GPU full, fragmented, held "
        "by an allocator's cache or limited, and who held it at that instant?",
        ("api", "syscall", "allocator"), _oom,
        gates=(Gate("oom", fail_on.oom_hit),),
        unrecorded_data={"incidents": [], "count": None},
        terminal="gputrace.render.oom_sections:oom_section",
        html=(f"{_SECTIONS}:oom",),
        diff=(DiffTable("oom_verdicts", "Out-of-memory incidents by verdict", ("by_verdict",),
                        ("verdict",), ("incidents", "failures", "requested_bytes"),
                        shown=("incidents", "failures")),),
        fleet=FleetUse(sums=("count", "failures"))),
    ReportSpec(
        "holders", "holders", "Device-file holders",
        "Who holds the NVIDIA device files, and what GPU memory does no live process own "
        "(children that inherited them, exited or zombie processes, pids of another PID "
        "namespace)?",
        ("syscall", "rm_query"), _holders,
        unrecorded_data={"instants": [], "orphaned_bytes": None},
        terminal="gputrace.render.holder_sections:holders_section",
        html=("gputrace.render.holder_html:holders_html",),
        fleet=FleetUse(sums=("orphaned_bytes", "cases"))),
    ReportSpec(
        "summary", "summary", "Summary",
        "Which driver calls cost what, and who holds how much GPU memory, on which GPU?",
        ("api", "driver", "syscall"), _summary, _summary_part, prepare=_pmm,
        terminal="gputrace.render.terminal:summary_section",
        html=(f"{_SECTIONS}:gpu_bytes", f"{_SECTIONS}:ioctl_latency"),
        columns={"by_pod": ("pod_namespace", "pod_name", *_SUMMARY_HELD, "pod_uid",
                            "qos_class"),
                 "by_container": ("pod_namespace", "pod_name", "container_name",
                                  *_SUMMARY_HELD, "container_id", "container_runtime",
                                  "pod_uid")},
        diff=(DiffTable("process_peaks", "Peak per process", ("processes",), ("layer", "comm"),
                        ("peak_bytes", "live_end_bytes"), is_bytes=True),
              DiffTable("gpu_peaks", "Peak per GPU", ("gpus", "gpus"), ("gpu_index",),
                        ("peak_bytes", "end_bytes"), is_bytes=True),
              DiffTable("ioctl_latency", "ioctl latency per command", ("ioctls",),
                        ("name", "device", "gpu_index"),
                        ("count", "failed", "latency_ns_p50", "latency_ns_p90",
                         "latency_ns_p99", "latency_ns_max"),
                        shown=("count", "latency_ns_p50", "latency_ns_p99", "latency_ns_max"),
                        add_up=False)),
        fleet=FleetUse(why_not="per-process and per-GPU figures of one trace: pids and GPU "
                               "indices name different things on different hosts")),
    ReportSpec(
        "tensors", "tensors", "Tensors alive (PyTorch)",
        "Which tensors are still alive, and which Python lines allocated them?",
        ("allocator",), _tensors,
        terminal="gputrace.render.allocator_sections:tensors_section",
        html=("gputrace.render.allocator_html:tensors_html",),
        diff=(DiffTable("tensors", "Tensors alive (PyTorch)", (), ("field",), ("value",)),
              DiffTable("tensor_sites", "Tensors alive by site (new, gone, grown)",
                        ("by_stack",), ("device", "site"), ("bytes", "count"),
                        is_bytes=True)),
        fleet=_ONE_PROCESS),
    ReportSpec(
        "allocator-pool", "allocator_pool", "PyTorch allocator pool",
        "How much memory did PyTorch's caching allocator reserve but not allocate, and how "
        "big is its largest free block?",
        ("allocator",), _allocator_pool,
        terminal="gputrace.render.allocator_sections:pool_section",
        html=("gputrace.render.allocator_html:pool_html",),
        diff=(DiffTable("allocator_pool", "PyTorch allocator pool", (), ("field",), ("value",)),
              DiffTable("allocator_pools", "PyTorch allocator per device and pool", ("pools",),
                        ("device", "pool"), ("reserved_bytes", "allocated_bytes",
                                             "reserved_unallocated_bytes",
                                             "largest_inactive_bytes", "segments"),
                        shown=("reserved_bytes", "allocated_bytes", "largest_inactive_bytes"),
                        is_bytes=True)),
        fleet=_ONE_PROCESS),
    ReportSpec(
        "allocator-growth", "allocator_growth", "PyTorch allocator growth",
        "Does memory held by tensors grow over the allocator's history, and which Python "
        "lines keep what they allocate?",
        ("allocator",), _allocator_growth,
        terminal="gputrace.render.allocator_sections:growth_section",
        html=("gputrace.render.allocator_html:growth_html",),
        fleet=_ONE_PROCESS),
]
"""Every report, in the order the CLI, JSON document, terminal, HTML page, diff and
fleet documents list them."""


def spec(name: str) -> ReportSpec:
    """The entry of the report whose CLI name is `name`."""
    return next(s for s in REPORTS if s.name == name)


def unrecorded(entry: ReportSpec, inp: Inputs, warnings: list[str]) -> Report | None:
    """The report of `entry` when the trace holds none of its layers (None when it holds
    one, or the report reads none): the one place that says "not recorded"."""
    from gputrace.analyses.report import not_recorded

    if not entry.layers or any(inp.has(layer) for layer in entry.layers):
        return None
    return not_recorded(entry.name, entry.question, list(entry.layers), warnings,
                        dict(entry.unrecorded_data))


def names() -> list[str]:
    """The CLI names of every report, in order."""
    return [s.name for s in REPORTS]


def selected(wanted: list[str]) -> list[ReportSpec]:
    """The reports named in `wanted` (CLI names), in registry order."""
    return [s for s in REPORTS if s.name in wanted]


def report(name: str) -> ReportSpec:
    """The report of CLI name `name`."""
    return next(s for s in REPORTS if s.name == name)


def gate_report(gate: str) -> ReportSpec:
    """The report a `--fail-on` condition reads."""
    return next(s for s in REPORTS if any(g.name == gate for g in s.gates))


def gates() -> list[Gate]:
    """Every `--fail-on` condition, in registry order."""
    return [g for s in REPORTS for g in s.gates]
