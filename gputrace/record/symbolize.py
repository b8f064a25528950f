"""User stack symbolization for the `stacks` table.

Addresses are placed in modules with /proc/PID/maps, read while the process is
alive (when it is first paused at its first API call, and again whenever an
address falls outside the known mappings); module files are parsed once (by
device and inode) with gputrace.record.elf. A frame whose module or symbol is
unknown counts as unresolved.
"""

from __future__ import annotations

import bisect
import os
from dataclasses import dataclass, field
from typing import Any

from gputrace.record import elf

PROC = "/proc"


@dataclass(frozen=True)
class Mapping:
    start: int
    end: int
    pgoff: int
    path: str


def read_maps(pid: int) -> list[Mapping] | None:
    """Executable file mappings of `pid`, sorted; None when the process is gone."""
    try:
        with open(f"{PROC}/{pid}/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    out = []
    for ln in lines:
        parts = ln.split(None, 5)
        if len(parts) < 6 or "x" not in parts[1]:
            continue
        lo, hi = parts[0].split("-")
        out.append(Mapping(int(lo, 16), int(hi, 16), int(parts[2], 16), parts[5]))
    return sorted(out, key=lambda m: m.start)


@dataclass
class Symbolizer:
    maps: dict[int, list[Mapping]] = field(default_factory=dict)
    modules: dict[tuple[int, int], elf.Elf | None] = field(default_factory=dict)
    by_path: dict[tuple[int, str], elf.Elf | None] = field(default_factory=dict)
    frames: int = 0
    unresolved: int = 0

    def refresh(self, pid: int) -> bool:
        m = read_maps(pid)
        if m is None:
            return False
        self.maps[pid] = m
        return True

    def _find(self, pid: int, ip: int) -> Mapping | None:
        maps = self.maps.get(pid, [])
        i = bisect.bisect_right([m.start for m in maps], ip) - 1
        if i >= 0 and ip < maps[i].end:
            return maps[i]
        return None

    def _module(self, pid: int, path: str) -> elf.Elf | None:
        key = (pid, path)
        if key in self.by_path:
            return self.by_path[key]
        mod: elf.Elf | None = None
        clean = path.removesuffix(" (deleted)")
        if clean.startswith("/"):
            for candidate in (f"{PROC}/{pid}/root{clean}", clean):
                try:
                    st = os.stat(candidate)
                except OSError:
                    continue
                ino = (st.st_dev, st.st_ino)
                if ino not in self.modules:
                    try:
                        self.modules[ino] = elf.read(candidate)
                    except elf.ElfError:
                        self.modules[ino] = None
                mod = self.modules[ino]
                break
        self.by_path[key] = mod
        return mod

    def stack_rows(self, pid: int, stack_id: int, ips: list[int]) -> list[dict[str, Any]]:
        """Rows of the `stacks` table. The stacks are taken at the uretprobe, so
        every address is a return address: the symbol is looked up at ip - 1."""
        if any(self._find(pid, ip) is None for ip in ips):
            self.refresh(pid)
        rows = []
        for depth, ip in enumerate(ips):
            m = self._find(pid, ip)
            module = offset = symbol = None
            if m is not None:
                module = m.path
                mod = self._module(pid, m.path)
                if mod is not None:
                    offset = mod.vaddr(ip - m.start + m.pgoff)
                    symbol = mod.symbol(offset - 1)
                else:
                    offset = ip - m.start + m.pgoff
            self.frames += 1
            if symbol is None:
                self.unresolved += 1
            rows.append({"pid": pid, "stack_id": stack_id, "depth": depth, "ip": ip,
                         "module": module, "offset": offset, "symbol": symbol})  # fmt: skip
        return rows
