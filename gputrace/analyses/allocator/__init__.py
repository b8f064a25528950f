"""Reports over the `allocator` layer (PyTorch's caching allocator, imported from its snapshots):
tensors alive, the pool, growth.
"""

from gputrace.analyses.report_spec import FleetUse

ONE_PROCESS = FleetUse(why_not="a PyTorch snapshot describes one process's allocator: "
                               "its blocks and lines do not add up across hosts")
"""How `fleet analyze` takes each of these reports: not at all."""
