"""Number options, read one way for every command.

Each parser takes the option's text exactly as typed and either returns a
value the analyses and the recorder can use as is (a Python int that fits in
64 bits, or a finite float) or raises `UsageError` with one line naming the
option: "nan", "inf", "1e300", negative numbers, zero where zero means
nothing, and values past 64 bits never reach the code that would loop
forever, divide by zero or overflow a Parquet column.

Decimal arithmetic keeps "0.1s" exactly 100000000 ns.
"""

from __future__ import annotations

import re
from decimal import Decimal

from gputrace.errors import UsageError

INT64_MAX = (1 << 63) - 1
"""Largest count, size or nanosecond value accepted (the Int64 columns' limit)."""

_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_NUMBER_UNIT = re.compile(rf"\s*({_NUMBER})\s*([a-zA-Zµ]*)\s*", re.ASCII)
_FRACTION = re.compile(rf"\s*({_NUMBER})\s*", re.ASCII)
_COUNT = re.compile(r"\s*\+?(\d+)\s*", re.ASCII)

DURATION_UNITS: dict[str, int] = {
    "ns": 1, "us": 10**3, "µs": 10**3, "ms": 10**6, "s": 10**9, "m": 60 * 10**9,
    "min": 60 * 10**9, "h": 3600 * 10**9,
}
"""Nanoseconds per unit; a bare number is in seconds."""

SIZE_UNITS: dict[str, int] = {
    "": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 10**6,
    "mib": 1 << 20, "g": 1 << 30, "gb": 10**9, "gib": 1 << 30, "t": 1 << 40, "tb": 10**12,
    "tib": 1 << 40,
}
"""Bytes per unit (case-insensitive); a bare number is in bytes."""


def _show(text: str) -> str:
    # repr escapes exactly what render.safe.printable escapes
    return repr(text[:40] + ("..." if len(text) > 40 else ""))


def _no_sign(text: str, option: str) -> None:
    if text.strip().startswith("-"):
        raise UsageError(f"{option} cannot be negative, not {_show(text)}")


def _decimal(digits: str) -> Decimal:
    # Exponents this far out are no sensible option value, and Decimal
    # arithmetic on them raises Overflow; any value past 1e40 or below 1e-40
    # is out of every range here, so it is replaced by one that still is.
    d = Decimal(digits)
    if d.adjusted() > 40:
        return Decimal("1e41")
    return Decimal(0) if d.adjusted() < -40 else d


def parse_count(text: str, option: str, *, minimum: int = 0,
                maximum: int = INT64_MAX) -> int:
    """A whole number in [minimum, maximum] (e.g. `--top`, `--limit`, `--thrash-min`)."""
    _no_sign(text, option)
    m = _COUNT.fullmatch(text)
    # int() refuses strings past 4300 digits; 30 digits is already past any maximum
    digits = (m.group(1).lstrip("0")[:30] or "0") if m else ""
    if not m or not minimum <= (value := int(digits)) <= maximum:
        raise UsageError(f"{option} must be a whole number from {minimum} to {maximum}, "
                         f"not {_show(text)}")
    return value


TOP_HELP = ("At most N rows per list in the document, in every format (the JSON and HTML "
            "as on the terminal).")
"""`--top`: rows a document keeps per list (analyze: each report's, `ReportOptions.top`;
fleet analyze: the fleet document's)."""
ROWS_HELP = ("Rows each terminal table shows (default 20, or --top's N when given); the "
             "rest are counted, and --format json or html has them.")
"""`--rows`: rows a terminal table shows of a list (the report keeps them all)."""


def parse_rows(text: str, option: str) -> int:
    """A row count such as `--top` or `--limit`: a whole number from 0 up to 64 bits.

    Past the most rows a Polars frame can index (2^32 - 1 in the default build),
    it means "all rows" and is lowered to that number, which `head` accepts.
    """
    import polars as pl

    most = (1 << 32) - 1 if pl.get_index_type() == pl.UInt32 else INT64_MAX
    return min(parse_count(text, option), most)


def parse_duration_ns(text: str, option: str, *, minimum_ns: int = 1,
                      maximum_ns: int = INT64_MAX) -> int:
    """A duration such as 30, 1.5s, 500ms, 5m, 1h or 250ns, in whole nanoseconds.

    A bare number is in seconds. Values below `minimum_ns` (1 ns by default,
    so zero is refused) or past `maximum_ns` (about 292 years) are errors;
    a fraction of a nanosecond is dropped.
    """
    _no_sign(text, option)
    m = _NUMBER_UNIT.fullmatch(text)
    if m is None or (m.group(3) and m.group(3) not in DURATION_UNITS):
        raise UsageError(f"{option}: cannot read {_show(text)} as a duration "
                         "(e.g. 30s, 500ms, 5m, 1h, 250ns; a bare number is seconds)")
    value = _decimal(m.group(1)) * DURATION_UNITS[m.group(3) or "s"]
    if not minimum_ns <= value <= maximum_ns:
        raise UsageError(f"{option} must be from {_ns_text(minimum_ns)} to "
                         f"{_ns_text(maximum_ns)}, not {_show(text)}")
    return int(value)


def parse_size(text: str, option: str, *, minimum: int = 0,
               maximum: int = INT64_MAX) -> int:
    """A byte count such as 4096, 64KiB, 2MiB, 1.5G (binary K/M/G/T; KB/MB/GB are 1000s)."""
    _no_sign(text, option)
    m = _NUMBER_UNIT.fullmatch(text)
    if m is None or m.group(3).lower() not in SIZE_UNITS:
        raise UsageError(f"{option}: cannot read {_show(text)} as a size "
                         "(e.g. 4096, 64KiB, 2MiB, 1G)")
    value = _decimal(m.group(1)) * SIZE_UNITS[m.group(3).lower()]
    if not minimum <= value <= maximum:
        raise UsageError(f"{option} must be from {minimum} to {maximum} bytes, "
                         f"not {_show(text)}")
    return int(value)


def parse_fraction(text: str, option: str, *, below_one: bool = True) -> float:
    """A finite number in [0, 1) (or [0, 1] when `below_one` is false), e.g. a threshold."""
    _no_sign(text, option)
    m = _FRACTION.fullmatch(text)
    d = _decimal(m.group(1)) if m else None
    top = "below 1" if below_one else "at most 1"
    if d is None or d > 1 or (below_one and d == 1):
        raise UsageError(f"{option} must be a number at least 0 and {top}, not {_show(text)}")
    return float(d)


def _ns_text(ns: int) -> str:
    if ns >= INT64_MAX:
        return f"{ns} ns (about 292 years)"
    for unit in ("h", "min", "s", "ms", "us"):
        per = DURATION_UNITS[unit]
        if ns >= per and ns % per == 0:
            return f"{ns // per} {unit}"
    return f"{ns} ns"
