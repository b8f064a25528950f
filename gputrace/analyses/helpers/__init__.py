"""Helpers shared by the reports; none of them is a report.

inputs (what every analysis receives from a trace), pairing (which free ends
which allocation), common (units, small shared expressions), fds (open file
descriptions replayed), gpus (the trace's GPUs and their memory), lifetimes
(alloc/free pairs per layer; API calls), rm_objects (RM object lifetimes),
uvm_ranges (UVM range and managed mmap lifetimes), partition (cutting a trace
into slices), stacks (call stacks), scans (polars settings for one scan-heavy
query), packed_keys (small integer group keys packed into one Int64).
"""
