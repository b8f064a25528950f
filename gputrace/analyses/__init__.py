"""Analyses: LazyFrames in, frames and `Report`s out, no I/O.

The reports `gputrace analyze` prints are listed once, in `registry.REPORTS`
(CLI name, JSON key, options, layers, terminal section, `--fail-on` gates);
`run.run_reports` runs them. Modules by role:

Reports (one registry entry each):
    leaks (`leaks`; joined view in leaks_joined), faults (`fault-rate`),
    fragmentation (`fragmentation`), summary (`summary`).
Parts of a report (each answers one question a report is built from):
    allocations, allocations_join (leaks), growth (leaks), cpu_faults, migrations
    (fault-rate), gpu_memory (fragmentation).
Helpers shared by reports (not reports themselves), in the `helpers` subpackage:
    common (inputs, pairing), fds, gpus, lifetimes, partition, rm_objects, stacks.
Other commands' analyses:
    diff (`gputrace diff`), timeseries (HTML plots, Perfetto timeline, folded stacks).
Plumbing:
    registry (the list of reports), run (running them, `--fail-on`), report (the
    `Report` object).
"""
