"""Reports over the `allocator` layer (PyTorch's caching allocator, imported from its snapshots):
tensors alive, the pool, growth.
"""
