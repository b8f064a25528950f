"""The compiled reader of runs of regular trace entries (`_entry_scan.c`), as columns.

torch_stream reads a run of entries of one shape either with its byte patterns
(torch_patterns: Python's regular-expression engine, then a tuple of byte strings per
entry) or, where the extension is built, with `_entry_scan.scan`, which reads the same
opcodes and returns the run as numpy columns: ~20x less CPU an entry. Both accept
exactly the same entries (tests/unit/importers/test_torch_stream.py reads every
fixture both ways); without a C compiler at install time the patterns serve alone.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np


def _compiled() -> ModuleType | None:
    """The compiled reader, or None: not built (no compiler at install time), or
    GPUTRACE_NO_COMPILED_SCAN set (to compare the two)."""
    if os.environ.get("GPUTRACE_NO_COMPILED_SCAN"):
        return None
    try:
        return importlib.import_module("gputrace.importers._entry_scan")
    except ImportError:
        return None


compiled = _compiled()

KEYED = {"action": 0, "compile_context": 1, "user_metadata": 2, "frames": 3}
"""The fields whose raw values come back as indices into their distinct values."""


@dataclass(frozen=True)
class Keyed:
    """One keyed field of a run: `index[i]` is entry i's value among `values` (raw
    opcode bytes, the empty string where the shape lacks the field), and
    `first[d]` the first entry that uses values[d]."""

    index: np.ndarray[Any, Any]
    values: list[bytes]
    first: np.ndarray[Any, Any]


@dataclass(frozen=True)
class Run:
    """Entries of one shape read from a position: `n` of them; `stop`, where the
    first entry not read starts; `paused`, the buffer ended inside it; `starts[i]`,
    where entry i starts; the integer columns; the keyed fields by KEYED name."""

    n: int
    stop: int
    paused: bool
    starts: np.ndarray[Any, Any]
    addr: np.ndarray[Any, Any]
    size: np.ndarray[Any, Any]
    stream: np.ndarray[Any, Any]
    time_us: np.ndarray[Any, Any]
    keyed: dict[str, Keyed]


def scan(buf: bytes, pos: int, entry_spec: bytes) -> Run:
    """The entries of the shape whose `Shape.spec` is `entry_spec` from buf[pos]
    (`compiled` must be set)."""
    assert compiled is not None
    n, stop, paused, starts, ints, keyed = compiled.scan(buf, pos, entry_spec)
    cols = np.frombuffer(ints, np.int64).reshape(4, n)
    return Run(n=n, stop=stop, paused=bool(paused), starts=np.frombuffer(starts, np.int64),
               addr=cols[0], size=cols[1], stream=cols[2], time_us=cols[3],
               keyed={name: Keyed(np.frombuffer(keyed[i][0], np.int32), keyed[i][1],
                                  np.frombuffer(keyed[i][2], np.int64))
                      for name, i in KEYED.items()})
