"""Hostile ELF files, built by the tests that feed them to the recorder (synthetic:
nothing here comes from a real library). Each is a well-formed ELF64 x86-64 shared
object as far as the recorder's parsers look (header, one executable PT_LOAD over
the whole file, section headers) whose symbol table or call frame information is
built to cost a naive parser gigabytes or minutes.
"""

from __future__ import annotations

import struct
from pathlib import Path

EHDR, PHDR, SHDR, SYM = 64, 56, 64, 24
SHT_PROGBITS, SHT_STRTAB, SHT_DYNSYM = 1, 3, 11
STT_FUNC, STB_GLOBAL = 2, 1


def _align(n: int, a: int = 16) -> int:
    return (n + a - 1) // a * a


def build(path: Path, sections: list[tuple[str, int, bytes, int, int]]) -> Path:
    """An ELF file holding `sections`: (name, sh_type, data, sh_link, sh_entsize), in
    that order in the file (the last one runs to the end of the file: a string table
    with no NUL there has none up to EOF). The section headers come first."""
    names = b"\0" + b"".join(n.encode() + b"\0" for n, *_ in sections) + b".shstrtab\0"
    shnum = len(sections) + 2
    shoff = EHDR + PHDR
    at = _align(shoff + shnum * SHDR)
    layout = []
    for name, kind, data, link, entsize in [*sections[:-1], (".shstrtab", SHT_STRTAB, names, 0, 0),
                                            sections[-1]]:  # fmt: skip
        layout.append((name, kind, data, link, entsize, at))
        at = _align(at + len(data))
    size = layout[-1][5] + len(layout[-1][2])
    out = bytearray(size)
    out[:EHDR] = struct.pack("<4sBBBBB7sHHIQQQIHHHHHH", b"\x7fELF", 2, 1, 1, 0, 0, b"", 3, 62, 1,
                             0, EHDR, shoff, 0, EHDR, PHDR, 1, SHDR, shnum,
                             len(sections))  # fmt: skip  (shstrndx: its slot above)
    out[EHDR : EHDR + PHDR] = struct.pack("<IIQQQQQQ", 1, 5, 0, 0, 0, size, size, 0x1000)
    order = range(len(sections) + 1)  # index less one: .shstrtab second last
    for (name, kind, data, link, entsize, off), index in zip(layout, order, strict=True):
        name_at = names.index(name.encode() + b"\0")
        hdr = struct.pack("<IIQQQQIIQQ", name_at, kind, 2 | 4, off, off, len(data), link,
                          1 if kind == SHT_DYNSYM else 0, 8, entsize)  # fmt: skip
        h = shoff + (index + 1) * SHDR
        out[h : h + SHDR] = hdr
        out[off : off + len(data)] = data
    path.write_bytes(bytes(out))
    return path


def symbol_bomb(path: Path, symbols: int = 1000, strtab: int = 8 << 20) -> Path:
    """`symbols` exported functions whose names all start in one string table of
    `strtab` bytes holding no NUL after its first byte (placed last: none up to EOF)."""
    dynstr = b"\0" + b"A" * (strtab - 1)
    syms = bytes(SYM) + b"".join(
        struct.pack("<IBBHQQ", 1 + i, STB_GLOBAL << 4 | STT_FUNC, 0, 1, 0x1000 + 16 * i, 16)
        for i in range(symbols))  # fmt: skip
    # section 1 .dynsym links to section 2 .dynstr (the last, after .shstrtab)
    return build(path, [(".dynsym", SHT_DYNSYM, syms, 3, SYM),
                        (".dynstr", SHT_STRTAB, dynstr, 0, 0)])


_CIE_INSNS = bytes([0x0C, 0x07, 0x08, 0x90, 0x01])  # def_cfa rsp+8; ra at cfa-8


def _cie() -> bytes:
    # version 1, augmentation "zR" (FDE addresses: absolute, 8 bytes), code align 1,
    # data align -8, return address column 16
    body = struct.pack("<I", 0) + bytes([1]) + b"zR\0" + bytes([1, 0x78, 16, 1, 0]) + _CIE_INSNS
    body += bytes(-(len(body) + 4) % 8)  # DW_CFA_nop padding
    return struct.pack("<I", len(body)) + body


def _fde(at: int, cie_at: int, start: int, size: int, insns: bytes) -> bytes:
    """An FDE at section offset `at` for the CIE at `cie_at` (absolute 8-byte addresses:
    the CIE's encoding), no augmentation data."""
    body = struct.pack("<IQQ", at + 4 - cie_at, start, size) + b"\0" + insns
    body += bytes(-(len(body) + 4) % 8)
    return struct.pack("<I", len(body)) + body


def eh_frame_lib(path: Path, frame: bytes) -> Path:
    return build(path, [(".eh_frame", SHT_PROGBITS, frame, 0, 0)])


def row_bomb(path: Path, rows: int = 2_000_000) -> Path:
    """One FDE of `rows` rows: advance_loc 1, def_cfa_offset 8 + (i % 15) * 8 each."""
    insns = b"".join(bytes([0x41, 0x0E, 8 + (i % 15) * 8]) for i in range(rows))
    cie = _cie()
    return eh_frame_lib(path, cie + _fde(len(cie), 0, 0x1000, rows + 16, insns) + bytes(4))


def cie_bomb(path: Path, cies: int = 1_000_000) -> Path:
    """`cies` CIEs and nothing else (24 bytes each)."""
    return eh_frame_lib(path, _cie() * cies + bytes(4))


def honest(path: Path, functions: int = 100) -> Path:
    """`functions` ordinary FDEs (push rbp-free prologue: cfa rsp+16 after 1 byte)."""
    cie = _cie()
    frame = bytearray(cie)
    for i in range(functions):
        frame += _fde(len(frame), 0, 0x1000 + 64 * i, 64, bytes([0x41, 0x0E, 16, 0x4F, 0x0E, 8]))
    return eh_frame_lib(path, bytes(frame) + bytes(4))


def sparse_eh_frame(path: Path, size: int = 1 << 30) -> Path:
    """An .eh_frame of `size` bytes of zeros (each 4 a terminator entry), the file
    sparse: a parser that reads the section whole holds `size` bytes."""
    eh_frame_lib(path, bytes(8))
    data = bytearray(path.read_bytes())
    shoff = struct.unpack_from("<Q", data, 40)[0]
    h = shoff + 2 * SHDR  # .shstrtab is section 1, .eh_frame section 2
    off = struct.unpack_from("<Q", data, h + 24)[0]
    struct.pack_into("<Q", data, h + 32, size)
    struct.pack_into("<QQ", data, EHDR + 32, off + size, off + size)  # PT_LOAD sizes
    path.write_bytes(bytes(data))
    with path.open("r+b") as f:
        f.truncate(off + size)
    return path
