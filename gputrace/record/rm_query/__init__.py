"""Source `rm_query` of the driver layer: our own RM client and the GPU memory sampler built on it.
"""
