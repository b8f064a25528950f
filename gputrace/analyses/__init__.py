"""Analyses: LazyFrames in, frames and `Report`s out, no I/O.

Each report declares itself in its own module: `SPEC`, its `ReportSpec` (CLI name,
JSON key, options, layers, terminal section, `--fail-on` gates, its place in the lists),
and the steps it names; `registry.REPORTS` is every `SPEC` the registry finds among
these modules, and `run.run_reports` runs them. Each module answers one question. By
role:

Reports: a module or a package named after the report (docs/reports.md lists them, a
table written from the registry: `python3 -m gputrace.docblocks`); a package's
`__init__` is the report and its modules are the parts it is built from, each answering
one question (`allocator/` holds three reports, one module each).
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
