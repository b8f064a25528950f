"""The recorder: BPF probes (probes/*.bpf.c) loaded with bcc, ring buffers
polled and decoded in bulk, written as a trace directory.

Only `loader` imports bcc; everything else here runs (and is tested) without it.
"""
