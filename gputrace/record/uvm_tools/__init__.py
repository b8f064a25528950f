"""Source `uvm_tools` of the driver layer: the driver's UVM tools interface (trackers, ABI, record
layouts, decoding, clock).
"""
