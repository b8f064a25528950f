"""User stack symbolization for the `stacks` table.

Addresses are placed in modules with /proc/PID/maps, read while the process is
alive (when it is first paused at its first API call, and again whenever an
address falls outside the known mappings); module files are parsed once (by
device and inode) with gputrace.record.elf; a module without .symtab takes its
symbols from its build-id debug file where one is installed
(DEBUG_ROOT/.build-id/xx/yyyy.debug, as gdb finds them). C++ names are
demangled by binutils' c++filt (the toolchain that built the stand-ins; no
Python demangler is as complete), once per name; without it they stay mangled.
Each distinct (pid, address) is symbolized once: the stacks of one program
share most of their frames. A frame whose module or symbol is unknown counts
as unresolved.
"""

from __future__ import annotations

import bisect
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any

from gputrace.record import elf

PROC = "/proc"
DEBUG_ROOT = "/usr/lib/debug"


def debug_file(build_id: str, root: str = DEBUG_ROOT) -> str | None:
    """The installed debug file of a build-id, or None."""
    if len(build_id) < 3:
        return None
    path = os.path.join(root, ".build-id", build_id[:2], build_id[2:] + ".debug")
    return path if os.path.isfile(path) else None


def with_debug_symbols(mod: elf.Elf, root: str = DEBUG_ROOT) -> elf.Elf:
    """`mod` with the symbols of its build-id debug file when it has no .symtab
    (the debug file's addresses are the module's link-time addresses)."""
    if mod.has_symtab or not mod.build_id:
        return mod
    path = debug_file(mod.build_id, root)
    if path is None:
        return mod
    try:
        dbg = elf.read(path)
    except elf.ElfError:
        return mod
    if dbg.build_id != mod.build_id or not dbg.starts:
        return mod
    mod.starts, mod.ends, mod.names = dbg.starts, dbg.ends, dbg.names
    mod.has_symtab = True
    return mod


_DEMANGLED: dict[str, str] = {}


def demangle(name: str) -> str:
    """A C++ (Itanium ABI) name as c++filt writes it; other names as they are."""
    if not name.startswith("_Z"):
        return name
    if name not in _DEMANGLED:
        exe = shutil.which("c++filt")
        out = name
        if exe is not None:
            try:
                r = subprocess.run([exe, "--", name], capture_output=True, text=True, timeout=10)
                out = r.stdout.strip() or name
            except (OSError, subprocess.TimeoutExpired):
                pass
        _DEMANGLED[name] = out
    return _DEMANGLED[name]


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
    starts: dict[int, list[int]] = field(default_factory=dict)
    # (pid, ip) -> (module, offset, symbol) of frames that fell in a mapping
    resolved: dict[tuple[int, int], tuple[str, int | None, str | None]] = field(
        default_factory=dict
    )
    frames: int = 0
    unresolved: int = 0
    skipped: dict[str, str] = field(default_factory=dict)  # module -> why not parsed

    def refresh(self, pid: int) -> bool:
        m = read_maps(pid)
        if m is None:
            return False
        self.maps[pid] = m
        self.starts[pid] = [x.start for x in m]
        return True

    def forget(self, pid: int) -> None:
        """Drop what is known of an exited process (its addresses may be reused)."""
        self.maps.pop(pid, None)
        self.starts.pop(pid, None)
        for key in [k for k in self.resolved if k[0] == pid]:
            del self.resolved[key]
        for path_key in [k for k in self.by_path if k[0] == pid]:
            del self.by_path[path_key]

    def _find(self, pid: int, ip: int) -> Mapping | None:
        maps = self.maps.get(pid, [])
        i = bisect.bisect_right(self.starts.get(pid, []), ip) - 1
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
                # one open: the identity cached under and the bytes parsed are one
                # file's (a name flipped between a stat and an open is not mixed in);
                # the mapping's name is its resolved file: a link there is refused
                try:
                    fd = elf.open_ro(candidate, nofollow=True)
                except OSError:
                    continue
                try:
                    st = os.fstat(fd)
                    ino = (st.st_dev, st.st_ino)
                    if ino not in self.modules:
                        try:
                            self.modules[ino] = with_debug_symbols(elf.read(candidate, fd=fd))
                        except elf.ElfError as e:
                            self.modules[ino] = None
                            self.skipped[clean] = str(e).removeprefix(f"{candidate}: ")
                    mod = self.modules[ino]
                except OSError:
                    continue
                finally:
                    os.close(fd)
                break
        self.by_path[key] = mod
        return mod

    def stack_rows(self, pid: int, stack_id: int, ips: list[int]) -> list[dict[str, Any]]:
        """Rows of the `stacks` table. The stacks are taken at the uretprobe, so
        every address is a return address: the symbol is looked up at ip - 1."""
        known = self.resolved
        if any((pid, ip) not in known and self._find(pid, ip) is None for ip in ips):
            self.refresh(pid)
        rows = []
        for depth, ip in enumerate(ips):
            hit = known.get((pid, ip))
            module, offset, symbol = hit if hit is not None else self._frame(pid, ip)
            self.frames += 1
            if symbol is None:
                self.unresolved += 1
            rows.append({"pid": pid, "stack_id": stack_id, "depth": depth, "ip": ip,
                         "module": module, "offset": offset, "symbol": symbol})  # fmt: skip
        return rows

    def _frame(self, pid: int, ip: int) -> tuple[str | None, int | None, str | None]:
        """(module, offset, symbol) of one address; cached when it is in a mapping."""
        m = self._find(pid, ip)
        if m is None:
            return None, None, None
        mod = self._module(pid, m.path)
        symbol = None
        if mod is not None:
            offset = mod.vaddr(ip - m.start + m.pgoff)
            symbol = mod.symbol(offset - 1)
            symbol = demangle(symbol) if symbol is not None else None
        else:
            offset = ip - m.start + m.pgoff
        self.resolved[(pid, ip)] = (m.path, offset, symbol)
        return m.path, offset, symbol
