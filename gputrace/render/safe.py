"""Text from a traced host, made safe to print on a terminal or to show in HTML.

A traced process chooses its own `comm` and command line, and symbol names,
module paths and even manifest fields come from machines and files the reader
does not control. Printed raw, an ESC byte starts a terminal escape sequence
(clear the screen, set the window title, plant a hyperlink), a newline forges
a report line and a bidi override reorders what the eye reads. Terminal
output therefore shows every such character as a visible escape; Parquet keeps
the text verbatim, JSON keeps its value but writes such characters as `\\u`
escapes (`json_ascii_safe`), CSV keeps it verbatim unless written to a terminal.

HTML is markup: `markup` escapes text for the page itself, and every figure the HTML
report hands to Plotly is built by `plot_figure`, which makes each string `plot_text`
(Plotly draws a subset of HTML in names, labels, hover text and titles: `<a href>` is a
clickable link, `<span style>` restyles, `<br>` and a newline forge a line).
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from typing import Any, NewType

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


def markup(text: object) -> str:
    """`text` as HTML character data or a quoted attribute value: `printable`, then
    `&`, `<`, `>`, `"` and `'` as entities; None is ''."""
    return html.escape(printable("" if text is None else text), quote=True)


def plot_text(text: object) -> str:
    """`text` as Plotly draws it verbatim: `printable` (a newline, which Plotly draws as a
    line break, and bidi controls become visible escapes), then `&`, `<` and `>` as
    entities. Plotly splits its text on `<...>` tags and decodes these entities once into
    a text node, so the result holds no tag and shows exactly the printable text. Quotes
    stay: outside a tag they are text, and Plotly would draw `&quot;` literally."""
    return html.escape(printable(text), quote=False)


PlotFigure = NewType("PlotFigure", dict[str, Any])
"""A Plotly figure (data + layout) whose every string went through `plot_text`."""

TEMPLATE_KEYS = frozenset({"hovertemplate", "texttemplate"})
"""Plotly attributes that are markup with `%{...}` fields filled from the (escaped) data."""


def _plot_safe(value: Any, key: str, templates: frozenset[str]) -> Any:
    if isinstance(value, str):
        if key in TEMPLATE_KEYS:
            if value not in templates:
                raise ValueError(f"unregistered Plotly {key} {value!r}: templates must be "
                                 "renderer constants, never formatted with trace text")
            return value
        return plot_text(value)
    if isinstance(value, dict):
        return {k: _plot_safe(v, k, templates) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plot_safe(v, key, templates) for v in value]
    return value


def plot_figure(data: Sequence[dict[str, Any]], layout: dict[str, Any],
                templates: frozenset[str] = frozenset()) -> PlotFigure:
    """The one way to build a figure for the HTML report: a copy of `data` and `layout`
    with every string value, at any depth, made `plot_text` (Plotly's attribute names,
    the dict keys, are the renderer's own and kept). Enumerated values and the report's
    own labels hold no `&`, `<`, `>` or control character, so only trace text changes.
    A hover or text template keeps its markup only if it is one of `templates` (the
    renderer's constants); any other raises ValueError."""
    return PlotFigure({"data": _plot_safe(list(data), "data", templates),
                       "layout": _plot_safe(layout, "layout", templates)})


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
