"""Helpers shared by the reports; none of them is a report.

common (inputs, pairing, units), fds (open file descriptions replayed),
gpus (the trace's GPUs and their memory), lifetimes (alloc/free pairs per
layer), partition (cutting a trace into slices), rm_objects (RM object
lifetimes), stacks (call stacks).
"""
