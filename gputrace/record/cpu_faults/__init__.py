"""Recorder layer `cpu_faults`: the `exceptions:page_fault_user` tracepoint filtered to managed
memory (probes/nv_faults.bpf.h).
"""
