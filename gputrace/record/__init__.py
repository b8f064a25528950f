"""The recorder: BPF probes (probes/*.bpf.c) loaded with bcc, ring buffers
polled and decoded in bulk, written as a trace directory.

Only `loader` imports bcc; everything else here runs (and is tested) without it.
Here: the core every recorder layer shares (recorder, session, the `Layer`
protocol in `layer` and its registration in `layers`, options, loader, decode
helpers, procfs). One folder per recorder layer: syscall, cpu_faults, api,
driver_layer (with its sources uvm_tools and rm_query). docs/design.md.
"""
