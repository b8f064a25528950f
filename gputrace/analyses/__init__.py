"""Analyses: LazyFrames in, frames and `Report`s out, no I/O.

The reports `gputrace analyze` prints are listed once, in `registry.REPORTS`
(CLI name, JSON key, options, layers, terminal section, `--fail-on` gates);
`run.run_reports` runs them. Each module answers one question. By role:

Reports: one registry entry each (docs/reports.md lists them, a table the registry
writes: `python3 -m gputrace.docblocks`). A report is a module or a package named after
it; a package's `__init__` is the report and its modules are the parts it is built from,
each answering one question.
Helpers shared by reports (not reports themselves), the `helpers` subpackage:
    inputs, pairing, common, fds, gpus, lifetimes, rm_objects, uvm_ranges,
    partition, stacks.
Other commands' analyses:
    diff (`gputrace diff`); timeseries (HTML plots, Perfetto timeline; a package),
    built from downsample, memory_over_time, rates_over_time, latency and
    stacks_by_bytes (also the folded stacks).
Plumbing:
    registry (the list of reports), report_spec (what a report is), fail_on (the
    `--fail-on` conditions), run (running them), report (the `Report` object),
    catalog (the reports' tables in the docs).
"""
