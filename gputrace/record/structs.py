"""The numpy mirrors of the probes' C structs, each registered where it is defined
(`mirror(header, struct, dtype)`), so that one test (tests/unit/record/test_event_structs.py)
compiles every registered header and compares each struct, field by field, with its
mirror: a layer's records, maps and configs have one source, its header, and a mirror
that disagrees fails before any recording. A struct dtype in gputrace/record/ that is
not registered fails the same test (unless it mirrors the driver's own ABI, checked
against the driver's facts instead)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

PROBES = Path(__file__).resolve().parents[2] / "probes"
"""Where the headers are (`mirror`'s `header` is relative to it)."""


@dataclass(frozen=True)
class Mirror:
    """`dtype` mirrors `struct <struct>` of probes/<header>: same size, each field at the
    same offset (the header compiled for user space, -DGT_USERSPACE)."""

    header: str
    struct: str
    dtype: np.dtype[Any]


MIRRORS: dict[str, Mirror] = {}
"""Every registered mirror, by struct name."""


def mirror(header: str, struct: str, dtype: np.dtype[Any]) -> np.dtype[Any]:
    """Register `dtype` as the mirror of `struct <struct>` in probes/<header>; returns it."""
    old = MIRRORS.get(struct)
    if old is not None and (old.header, old.dtype) != (header, dtype):
        raise ValueError(f"struct {struct} mirrored twice")
    MIRRORS[struct] = Mirror(header, struct, dtype)
    return dtype
