"""Recorder layer `torch_allocator`: PyTorch's CUDA caching allocator, live (layer,
symbols per release, decode)."""
