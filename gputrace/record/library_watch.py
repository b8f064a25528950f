"""Which processes map a library a uprobe layer wants: one service for every layer.

The API layer finds libcuda itself (its own probes stop a process at a libcuda load,
record/api/libcuda.py). Other uprobe layers subscribe here with the file name they want
(`libc10_cuda.so` for the torch_allocator layer): the API layer calls `scan(pid)` for
every process it looks at (every target at the start, each process it pauses at a
libcuda load or first call) and each subscriber hears of every matching file once per
inode, while the process that maps it is still stopped. A framework library is mapped
before libcuda is (PyTorch loads libc10_cuda at `import torch`, libcuda at CUDA's first
call), so it is found before its first device allocation.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

OnLibrary = Callable[[str, str, int], None]
"""(path the recorder can open, path as the process names it, pid)."""


@dataclass
class _Subscriber:
    pattern: re.Pattern[str]
    on_library: OnLibrary
    inodes: set[tuple[int, int]] = field(default_factory=set)


@dataclass
class LibraryWatch:
    """Subscribers by library file name; `scan` hands each its new files."""

    subscribers: list[_Subscriber] = field(default_factory=list)

    def subscribe(self, pattern: str, on_library: OnLibrary) -> None:
        """`on_library` for every mapped file whose base name matches `pattern`."""
        self.subscribers.append(_Subscriber(re.compile(pattern), on_library))

    def scan(self, pid: int) -> None:
        """Read `pid`'s mappings (only when someone subscribed) and hand over new files."""
        if not self.subscribers:
            return
        paths: set[str] = set()
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].startswith("/"):
                    paths.add(parts[5].removesuffix(" (deleted)"))
        for shown in sorted(paths):
            base = os.path.basename(shown)
            for sub in self.subscribers:
                if not sub.pattern.match(base):
                    continue
                path = shown if os.path.exists(shown) else f"/proc/{pid}/root{shown}"
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                key = (st.st_dev, st.st_ino)
                if key in sub.inodes:
                    continue
                sub.inodes.add(key)
                sub.on_library(path, shown, pid)
