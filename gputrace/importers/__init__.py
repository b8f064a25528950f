"""Importers: traces made from what other tools wrote, not from a recording.

`gputrace import KIND FILE -o TRACE` turns a foreign file into a trace directory the
analyses read like any other (docs/importers.md). Each importer treats its file as
untrusted input: it never runs code from it, and a damaged or hostile file ends in one
line naming what is wrong.

- `safe_pickle`: reading a pickle without running it (a restricted unpickler) and
  without holding the file twice (streamed decompression);
- `torch_snapshot`: PyTorch CUDA caching-allocator memory snapshots -> the
  `allocator` layer (every format PyTorch has written: `torch_rows` for segments and
  blocks, `torch_entries` for the trace entries); `torch_join` joins one to a
  recording of the same process.
"""
