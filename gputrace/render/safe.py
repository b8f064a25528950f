"""Text from a traced host, made safe to print on a terminal.

A traced process chooses its own `comm` and command line, and symbol names,
module paths and even manifest fields come from machines and files the reader
does not control. Printed raw, an ESC byte starts a terminal escape sequence
(clear the screen, set the window title, plant a hyperlink), a newline forges
a report line and a bidi override reorders what the eye reads. Terminal
output therefore shows every such character as a visible escape; Parquet keeps
the text verbatim, JSON keeps its value but writes such characters as `\\u`
escapes (`json_ascii_safe`), CSV keeps it verbatim unless written to a terminal.
"""

from __future__ import annotations

import re
from typing import Any

_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    cp = ord(ch)
    if cp < 0x100:
        return f"\\x{cp:02x}"
    if cp < 0x10000:
        return f"\\u{cp:04x}"
    return f"\\U{cp:08x}"


def printable(text: object) -> str:
    """`text` as a string in which every character a terminal could act on is escaped.

    The rule is Python's `str.isprintable`: control characters (C0, DEL, C1,
    hence ESC, CSI and OSC), format characters (bidi overrides and isolates
    U+202A..U+202E, U+2066..U+2069, zero-width characters), line and paragraph
    separators, lone surrogates (undecodable bytes) and unassigned code points
    become `\\xNN`, `\\uNNNN` or `\\UNNNNNNNN`; tab, newline and carriage
    return become `\\t`, `\\n`, `\\r`. Everything else, backslashes included,
    is kept, so ordinary text is unchanged.
    """
    s = text if isinstance(text, str) else str(text)
    if s.isprintable():
        return s
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in s)


def printable_tree(value: Any) -> Any:
    """A copy of a JSON-ready value with every string (keys too) made `printable`."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable_tree(k): printable_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [printable_tree(v) for v in value]
    return value


_NON_ASCII = re.compile(r"[^\x00-\x7e]")  # DEL too


def _json_escape(m: re.Match[str]) -> str:
    ch = m.group()
    if ch.isprintable():
        return ch
    cp = ord(ch)
    if cp < 0x10000:
        return f"\\u{cp:04x}"
    cp -= 0x10000  # JSON spells a code point past the BMP as a surrogate pair
    return f"\\u{0xD800 + (cp >> 10):04x}\\u{0xDC00 + (cp & 0x3FF):04x}"


def json_ascii_safe(text: str) -> str:
    """JSON text (a document or JSON Lines) with every non-ASCII character a terminal
    could act on (C1 controls such as CSI, bidi overrides, zero-width and other format
    characters, line separators) written as a `\\uXXXX` escape: the same JSON value,
    and safe on a terminal. Outside strings JSON is ASCII, so only strings change;
    ASCII controls are escaped by every JSON writer already."""
    if text.isascii() and "\x7f" not in text:
        return text
    return _NON_ASCII.sub(_json_escape, text)
