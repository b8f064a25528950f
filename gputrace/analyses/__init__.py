"""Analyses: LazyFrames in, frames and `Report`s out, no I/O.

The reports `gputrace analyze` prints are listed once, in `registry.REPORTS`
(CLI name, JSON key, options, layers, terminal section, `--fail-on` gates);
`run.run_reports` runs them. Each module answers one question. By role:

Reports (one registry entry each; the module or package is named after the
report, a package's `__init__` is the report and its modules are the report's parts):
    leaks (`leaks`), fault_rate (`fault-rate`), fragmentation (`fragmentation`),
    summary (`summary`).
Parts of a report (each answers one question a report is built from):
    leaks:         allocations, allocation_rows, allocations_join, leaks_joined,
                   growth.
    fault-rate:    fault_windows, fault_batches, cpu_faults, migrations,
                   uvm_events, thrashing, oversubscription.
    fragmentation: rm_fragmentation, gpu_memory, pmm_chunks, va_reservations,
                   free_space.
Helpers shared by reports (not reports themselves), the `helpers` subpackage:
    inputs, pairing, common, fds, gpus, lifetimes, rm_objects, uvm_ranges,
    partition, stacks.
Other commands' analyses:
    diff (`gputrace diff`); timeseries (HTML plots, Perfetto timeline; a package),
    built from downsample, memory_over_time, rates_over_time, latency and
    stacks_by_bytes (also the folded stacks).
Plumbing:
    registry (the list of reports), report_spec (what a report is), fail_on (the
    `--fail-on` conditions), run (running them), report (the `Report` object).
"""
