"""How gputrace writes a byte count for people, everywhere it does (terminal, HTML,
alert messages, fleet text): binary units, one decimal above 1 KiB, the sign kept,
and a caller-chosen word for "no value". Formats only, computes nothing."""

from __future__ import annotations

from typing import Any

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def format_bytes(value: Any, *, none: str = "-") -> str:
    """1536 -> '1.5 KiB', -2097152 -> '-2.0 MiB', 512 -> '512 B'; `none` for None.
    Above 1024 TiB the count stays in TiB."""
    if value is None:
        return none
    n = float(value)
    for unit in _UNITS:
        if abs(n) < 1024 or unit == _UNITS[-1]:
            return f"{n:.0f} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable: the last unit always returns")  # pragma: no cover
