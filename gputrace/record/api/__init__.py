"""Recorder layer `api`: uprobes on libcuda's memory calls (probes/cuda.bpf.c), their stacks and
the watchdog that resumes paused processes.
"""
