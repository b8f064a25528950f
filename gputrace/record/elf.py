"""A minimal ELF64 little-endian reader: file type, loadable segments and
function symbols (.symtab, else .dynsym). Enough to check `--libcuda`, list the
symbols a library exports, and symbolize stack addresses; no dependencies."""

from __future__ import annotations

import bisect
import mmap
import struct
from dataclasses import dataclass, field

ET_EXEC, ET_DYN = 2, 3
PT_LOAD, PT_NOTE = 1, 4
NT_GNU_BUILD_ID = 3
SHT_SYMTAB, SHT_DYNSYM = 2, 11
STT_FUNC, STT_GNU_IFUNC = 2, 10
STB_GLOBAL, STB_WEAK = 1, 2


class ElfError(ValueError):
    pass


@dataclass
class Elf:
    path: str
    e_type: int
    loads: list[tuple[int, int, int]] = field(default_factory=list)  # (offset, vaddr, filesz)
    starts: list[int] = field(default_factory=list)  # function symbols sorted by address
    ends: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    exported: set[str] = field(default_factory=set)  # defined global functions in .dynsym
    build_id: str = ""  # the GNU build-id note, hex ("" when none)
    has_symtab: bool = False  # .symtab present (else only .dynsym's exports are named)

    def vaddr(self, file_offset: int) -> int:
        """The link-time address of a file offset (what addr2line takes)."""
        for off, va, size in self.loads:
            if off <= file_offset < off + max(size, 1):
                return file_offset - off + va
        return file_offset

    def symbol(self, vaddr: int) -> str | None:
        i = bisect.bisect_right(self.starts, vaddr) - 1
        while i >= 0 and self.starts[i] <= vaddr:
            if vaddr < self.ends[i]:
                return self.names[i]
            if self.ends[i] > self.starts[i]:  # sized and past it: no outer symbol to try
                return None
            i -= 1
        return None


def read(path: str, symbols: bool = True) -> Elf:
    """Parse `path`; raises ElfError when it is not a readable ELF64 LE file."""
    try:
        with open(path, "rb") as f:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as e:
        raise ElfError(f"{path}: {e}") from None
    try:
        return _parse(path, data, symbols)
    except (struct.error, IndexError) as e:
        raise ElfError(f"{path}: truncated or malformed ELF ({e})") from None
    finally:
        data.close()


def _parse(path: str, d: mmap.mmap, symbols: bool) -> Elf:
    if d[:4] != b"\x7fELF":
        raise ElfError(f"{path}: not an ELF file")
    if d[4] != 2 or d[5] != 1:
        raise ElfError(f"{path}: not a 64-bit little-endian ELF file")
    (e_type,) = struct.unpack_from("<H", d, 16)
    phoff, shoff = struct.unpack_from("<QQ", d, 32)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", d, 54)
    elf = Elf(path, e_type)
    for i in range(phnum):
        p_type, _fl, p_offset, p_vaddr, _pa, p_filesz = struct.unpack_from(
            "<IIQQQQ", d, phoff + i * phentsize
        )
        if p_type == PT_LOAD:
            elf.loads.append((p_offset, p_vaddr, p_filesz))
        elif p_type == PT_NOTE and not elf.build_id:
            elf.build_id = _build_id(d, p_offset, p_filesz)
    if not symbols:
        return elf
    sections = [struct.unpack_from("<IIQQQQIIQQ", d, shoff + i * shentsize) for i in range(shnum)]
    syms: dict[int, tuple[int, str]] = {}
    for want in (SHT_DYNSYM, SHT_SYMTAB):
        for sh in sections:
            if sh[1] != want or sh[9] == 0:
                continue
            elf.has_symtab |= want == SHT_SYMTAB
            strtab = sections[sh[6]]
            str_off = strtab[4]
            for j in range(sh[5] // sh[9]):
                st_name, st_info, _o, st_shndx, st_value, st_size = struct.unpack_from(
                    "<IBBHQQ", d, sh[4] + j * sh[9]
                )
                kind, bind = st_info & 0xF, st_info >> 4
                if kind not in (STT_FUNC, STT_GNU_IFUNC) or st_shndx == 0 or st_value == 0:
                    continue
                end = d.find(b"\0", str_off + st_name)
                name = d[str_off + st_name : end].decode("utf-8", "replace")
                if want == SHT_DYNSYM and bind in (STB_GLOBAL, STB_WEAK):
                    elf.exported.add(name)
                if st_value not in syms or syms[st_value][0] == 0:
                    syms[st_value] = (st_size, name)
    for start in sorted(syms):
        size, name = syms[start]
        elf.starts.append(start)
        elf.ends.append(start + size)
        elf.names.append(name)
    return elf


def _build_id(d: mmap.mmap, off: int, size: int) -> str:
    """The GNU build-id in the notes at [off, off + size), hex; "" when none."""
    end = min(off + size, len(d))
    while off + 12 <= end:
        namesz, descsz, kind = struct.unpack_from("<III", d, off)
        name_at = off + 12
        desc_at = name_at + (namesz + 3) // 4 * 4
        if kind == NT_GNU_BUILD_ID and d[name_at : name_at + namesz] == b"GNU\0":
            return bytes(d[desc_at : desc_at + descsz]).hex()
        off = desc_at + (descsz + 3) // 4 * 4
    return ""
