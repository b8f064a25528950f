"""Byte patterns of a PyTorch snapshot's regular trace entries (torch_stream).

An entry with the keys `keys`, in that order, is `EMPTY_DICT MEMOIZE MARK`, then per
key a reference to the memo slot holding the key's string and one opcode (or a few)
for its value, then `SETITEMS`. A value is matched by the opcodes a plain value of its
field can be: an integer opcode (BININT1, BININT2, BININT, LONG1 of up to 9 bytes), a
memo reference, an inline `N/A` or empty string, a frames list of memo references.
Every alternative consumes whole opcodes, and no two can both match at one place, so a
match is the opcode sequence the pickle holds: the regular-expression engine reads the
entries at C speed, and torch_stream checks each value as torch_entries would.
"""

from __future__ import annotations

import re
from operator import itemgetter

FAST_KEYS = ("action", "addr", "size", "stream", "time_us", "compile_context",
             "user_metadata", "frames")
"""The fields of the common entry, in the order a pattern's groups are read back."""
MAX_SHAPES = 16
"""Most entry patterns compiled (PyTorch writes one key order; oom entries differ)."""

_F = rb"(?:\x95.{8})?+"  # a FRAME opcode (a length hint, skipped) may precede any opcode
_REF = rb"(?:h.|j.{4})"
_INTS = (rb"K.|M..|J.{4}|"
         + b"|".join(b"\\x8a" + b"\\x%02x" % n + b".{%d}" % n for n in range(1, 10)))
_TEXTS = rb"N|" + _REF + rb"|\x8c\x03N/A" + _F + rb"\x94|\x8c\x00" + _F + rb"\x94"
_LISTS = (rb"N|" + _REF + rb"|\]" + _F + rb"\x94(?:" + _F + rb"\((?:" + _F + _REF
          + rb"){2,1000}+" + _F + rb"e|" + _F + _REF + _F + rb"a)?+")
_VALUE = {"action": _REF, "addr": _INTS, "size": _INTS, "stream": _INTS, "time_us": _INTS,
          "compile_context": _TEXTS, "user_metadata": _TEXTS, "frames": _LISTS}
MAX_LENGTHS = 64
"""Most frames lists (their sequences of reference opcodes) unrolled into an entry's
quick pattern."""
INLINE_TEXTS = {b"\x8c\x03N/A\x94": "N/A", b"\x8c\x00\x94": "", b"N": None, b"": None}


def _ref_bytes(i: int) -> bytes:
    """How a pickler refers to memo slot `i`."""
    return b"h" + bytes([i]) if i < 256 else b"j" + i.to_bytes(4, "little")


def memo_slot(ref: bytes) -> int:
    return ref[1] if ref[0] == 0x68 else int.from_bytes(ref[1:5], "little")


def opcode_int(b: bytes) -> int:
    """The integer an integer opcode (BININT1, BININT2, BININT, LONG1) pushes."""
    c = b[0]
    if c == 0x8A:
        return int.from_bytes(b[2:], "little", signed=True)
    if c == 0x4B:
        return b[1]
    if c == 0x4D:
        return b[1] | b[2] << 8
    return int.from_bytes(b[1:], "little", signed=True)


def _entry_pattern(keys: tuple[str, ...], slots: dict[str, int], frame: bytes,
                   lists: bytes) -> bytes:
    """An entry of these keys: `frame` before each opcode, `lists` for frames."""
    value = {**_VALUE, "frames": lists}
    body = b"".join(frame + re.escape(_ref_bytes(slots[k])) + frame + b"(" + value[k] + b")"
                    for k in keys)
    return frame + rb"\}" + frame + rb"\x94" + frame + rb"\(" + body + frame + b"u()"


def entry_spec(keys: tuple[str, ...], slots: dict[str, int]) -> bytes:
    """What the compiled reader (torch_scan) reads an entry of these keys by: per key,
    in order, its field (its FAST_KEYS index), the length of the reference to its memo
    slot, the reference's bytes."""
    out = bytearray()
    for k in keys:
        ref = _ref_bytes(slots[k])
        out += bytes([FAST_KEYS.index(k), len(ref)]) + ref
    return bytes(out)


class Shape:
    """The patterns of an entry with these keys, in this order: `slow` takes FRAME
    opcodes anywhere and any frames list of references; `fast` (a run of entries in
    one pass) none, and frames lists of LONG_BINGETs of the lengths seen so far, each
    unrolled (a repeated group costs the regular-expression engine ~0.5 us a turn)."""

    def __init__(self, keys: tuple[str, ...], slots: dict[str, int]) -> None:
        self.keys, self.slots = keys, slots
        self.canon = itemgetter(*[keys.index(k) if k in keys else len(keys)
                                  for k in FAST_KEYS])
        self.memo_order = tuple(sorted(
            (FAST_KEYS.index(k) for k in keys if FAST_KEYS.index(k) >= 5),
            key=lambda i: keys.index(FAST_KEYS[i])))
        """FAST_KEYS positions whose value may store a memo slot, in the entry's order."""
        self.slow = re.compile(_entry_pattern(keys, slots, _F, _LISTS), re.S)
        self.spec = entry_spec(keys, slots)
        self.lengths: set[bytes] = set()
        """the opcodes (h or j) of each frames list unrolled"""
        self.fast = self.run = self.slow
        self._compile()

    def _compile(self) -> None:
        unrolled = b"".join(rb"|\(" + b"".join(rb"h." if c == 0x68 else rb"j.{4}" for c in sig)
                            + b"e" for sig in sorted(self.lengths))
        lists = rb"N|" + _REF + rb"|\]\x94(?:" + _REF + b"a" + unrolled + b")?+"
        fast = _entry_pattern(self.keys, self.slots, b"", lists)
        self.fast = re.compile(fast, re.S)
        self.run = re.compile(b"(?:" + fast + b")++", re.S)

    def learn(self, frames: bytes) -> None:
        """Unroll this frames list's references (BINGET or LONG_BINGET each) into
        `fast`, when it has no FRAME inside."""
        if len(self.lengths) >= MAX_LENGTHS or frames[:3] != b"]\x94(" or frames[-1:] != b"e":
            return
        sig = bytearray()
        pos, end = 3, len(frames) - 1
        while pos < end:
            c = frames[pos]
            if c not in (0x68, 0x6A):
                return
            sig.append(c)
            pos += 2 if c == 0x68 else 5
        if pos == end and len(sig) >= 2 and bytes(sig) not in self.lengths:
            self.lengths.add(bytes(sig))
            self._compile()
