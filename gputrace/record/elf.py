"""A minimal ELF64 little-endian reader: file type, loadable segments and
function symbols (.symtab, else .dynsym). Enough to check `--libcuda`, list the
symbols a library exports, and symbolize stack addresses; no dependencies.

The files are any a traced process opens as libcuda or maps executable, so the
parse is bounded whatever they hold (docs/security.md, "ELF files"): a file over
MAX_FILE_BYTES is refused, each symbol name is cut at MAX_NAME_BYTES, at most
MAX_SYMBOLS symbol entries are read and at most MAX_NAMES_BYTES of names decoded
(relative to the string tables' own size), else ElfError says which bound.
The file is opened once: what is parsed and its identity (`dev`, `ino`, from
fstat of that descriptor) are the same file."""

from __future__ import annotations

import bisect
import errno
import fcntl
import mmap
import os
import stat
import struct
from dataclasses import dataclass, field

ET_EXEC, ET_DYN = 2, 3
PT_LOAD, PT_NOTE = 1, 4
NT_GNU_BUILD_ID = 3
SHT_SYMTAB, SHT_DYNSYM = 2, 11
STT_FUNC, STT_GNU_IFUNC = 2, 10
STB_GLOBAL, STB_WEAK = 1, 2

MAX_FILE_BYTES = 4 << 30
"""The largest file parsed: the largest libraries of a CUDA stack (libtorch_cuda,
cuDNN's engines, cuBLASLt) are 0.5-2 GiB."""
MAX_NAME_BYTES = 16 << 10
"""A symbol name longer than this is cut here (the longest C++ names of PyTorch's
libraries are a few KiB); the name is found by a bounded search for its NUL."""
MAX_SYMBOLS = 4_000_000
"""Symbol entries read from one file (.dynsym and .symtab together): libtorch_cpu's
unstripped tables hold ~10^6."""
MAX_NAMES_BYTES = 256 << 20
"""Bytes of names decoded from one file, at most; and at most NAMES_PER_TABLE_BYTE
times the string tables' size plus 1 MiB (tail merging lets names share bytes, a
little): names that all overlap one long string are refused, not decoded again."""
NAMES_PER_TABLE_BYTE = 4


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
    dev: int = 0  # identity of the file parsed (fstat of the descriptor read)
    ino: int = 0
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


def open_ro(path: str, nofollow: bool = False) -> int:
    """A read-only descriptor on `path` (O_NOFOLLOW: where the name is a mapping's
    resolved file, a link there is not the file mapped); OSError as open raises it.
    O_NONBLOCK: a traced process can put a FIFO where a library is looked for (a
    file it opens named libcuda.so.1), whose blocking open waits for a writer
    forever; it is opened at once and refused as not a regular file."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK
    return os.open(path, flags | (os.O_NOFOLLOW if nofollow else 0))


def read(path: str, symbols: bool = True, *, fd: int | None = None,
         nofollow: bool = False) -> Elf:
    """Parse `path` (or the descriptor `fd` opened on it, which stays open); raises
    ElfError when it is not a readable ELF64 LE file or is over a bound."""
    own = fd is None
    try:
        if fd is None:
            fd = open_ro(path, nofollow)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ElfError(f"{path}: not a regular file")
        if st.st_size > MAX_FILE_BYTES:
            raise ElfError(f"{path}: file of {st.st_size} bytes, over the "
                           f"{MAX_FILE_BYTES >> 20} MiB bound (not parsed)")
        _hold(fd, path)
        data = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    except ElfError:
        raise
    except (OSError, ValueError) as e:
        raise ElfError(f"{path}: {e}") from None
    finally:
        if own and fd is not None:
            os.close(fd)
    try:
        elf = _parse(path, data, symbols)
        elf.dev, elf.ino = st.st_dev, st.st_ino
        return elf
    except (struct.error, IndexError) as e:
        raise ElfError(f"{path}: truncated or malformed ELF ({e})") from None
    finally:
        data.close()


def _hold(fd: int, path: str) -> None:
    """Keep the file whole while it is parsed through a mapping: a page past a
    shortened end is SIGBUS, which ends the process (the root recorder, its trace
    left `recording`), and the file is a traced process's to truncate. A read lease
    makes every open for writing and every truncate of it wait until the parse is
    done (at most the kernel's lease-break-time, 45 s by default); a file already open
    for writing gets none and is refused. Where leases are not to be had (a
    filesystem without them, a recorder without CAP_LEASE) the file is parsed as it is."""
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except OSError as e:
        if e.errno == errno.EAGAIN:
            raise ElfError(f"{path}: open for writing by a process (not parsed: it could be "
                           "cut short under the parse)") from None
        return
    # the lease's break signal (SIGIO, whose default ends the process) goes nowhere
    fcntl.fcntl(fd, fcntl.F_SETOWN, 0)


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
    tables = [sh for want in (SHT_DYNSYM, SHT_SYMTAB) for sh in sections
              if sh[1] == want and sh[9] != 0]
    count = sum(sh[5] // sh[9] for sh in tables)
    if count > MAX_SYMBOLS:
        raise ElfError(f"{path}: {count} symbol entries, over the bound of {MAX_SYMBOLS}")
    strtab_bytes = sum(min(sections[sh[6]][5], len(d)) for sh in tables)
    ceiling = min(MAX_NAMES_BYTES, NAMES_PER_TABLE_BYTE * strtab_bytes + (1 << 20))
    budget = ceiling
    names: dict[int, str] = {}  # file offset -> name: one decode per distinct name
    for sh in tables:
        want = sh[1]
        elf.has_symtab |= want == SHT_SYMTAB
        str_off = sections[sh[6]][4]
        for j in range(sh[5] // sh[9]):
            st_name, st_info, _o, st_shndx, st_value, st_size = struct.unpack_from(
                "<IBBHQQ", d, sh[4] + j * sh[9]
            )
            kind, bind = st_info & 0xF, st_info >> 4
            if kind not in (STT_FUNC, STT_GNU_IFUNC) or st_shndx == 0 or st_value == 0:
                continue
            at = str_off + st_name
            name = names.get(at)
            if name is None:
                end = d.find(b"\0", at, at + MAX_NAME_BYTES)
                raw = d[at : end if end >= 0 else at + MAX_NAME_BYTES]
                budget -= len(raw)
                if budget < 0:
                    raise ElfError(f"{path}: symbol names over {ceiling} bytes (string "
                                   f"tables of {strtab_bytes} bytes; not parsed)")
                name = names[at] = raw.decode("utf-8", "replace")
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
