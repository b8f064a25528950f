"""The driver layer: the recorder asks the NVIDIA driver through its own interfaces, with no kernel
probe, and writes trace layers `uvm_tools` (source: record/uvm_tools) and `rm_query` (source:
record/rm_query). docs/driver-layer.md.
"""
