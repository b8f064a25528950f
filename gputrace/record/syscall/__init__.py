"""Recorder layer `syscall`: tracepoints on the NVIDIA device files' syscalls
(probes/gputrace.bpf.c, loaded by record/loader.py).
"""
