"""CLOCK_MONOTONIC_RAW -> CLOCK_MONOTONIC for UVM tools records, as a pure function
of the raw timestamp: equal raw times get equal converted times and order is kept,
whichever drain or decoder feed a record arrived in.

The driver stamps tools records with CLOCK_MONOTONIC_RAW; the trace's clock is
CLOCK_MONOTONIC, which NTP slews. The driver layer measures (raw, mono) points
(a monotonic read bracketed by two raw reads) at start and after every drain, and
converts with the piecewise-linear map through those points: between two points
the offset mono - raw moves linearly, before the first and after the last it is
held. A point is measured *after* its drain, so every drained record's raw time
lies at or before the newest point when it is converted: the segment it falls in
is then final, and later points never change what an earlier conversion gave.

Two rules keep the map monotone and bounded:
- an offset moves at most MAX_DRIFT (1000 ppm; NTP slews at most 500) per ns of raw
  time between points; a noisy measurement is clamped into that band, so the
  converted clock advances at least 0.999 ns per raw ns (rounding keeps it
  non-decreasing);
- a point less than MIN_GAP_NS after the one before it replaces the previous point
  when no conversion has used that one yet (back-to-back drains of a busy queue),
  so the table grows by at most one point per MIN_GAP_NS of recording.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import numpy.typing as npt

MAX_DRIFT = 1e-3
MIN_GAP_NS = 5_000_000


def measure() -> tuple[int, int]:
    """One (raw, mono) point: CLOCK_MONOTONIC read between two CLOCK_MONOTONIC_RAW
    reads, paired with their midpoint."""
    r0 = time.clock_gettime_ns(time.CLOCK_MONOTONIC_RAW)
    m = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    r1 = time.clock_gettime_ns(time.CLOCK_MONOTONIC_RAW)
    return (r0 + r1) // 2, m


class RawClock:
    """The measured (raw, offset) points and the map through them. `add` and
    `snapshot` are called under the caller's lock; a snapshot is immutable."""

    def __init__(self) -> None:
        self._raw = np.zeros(64, np.int64)
        self._off = np.zeros(64, np.int64)
        self._n = 0
        self._sealed = 0  # points a snapshot has handed out: never replaced

    def __len__(self) -> int:
        return self._n

    def add(self, raw: int, mono: int) -> None:
        """Add a measured point (raw times must increase; an older one is ignored)."""
        off = mono - raw
        n = self._n
        if n and raw <= self._raw[n - 1]:
            return
        if n >= 2 and n - 1 >= self._sealed and raw - int(self._raw[n - 2]) < MIN_GAP_NS:
            n -= 1  # replace the previous point: nobody converted with it yet
        if n:
            prev_raw, prev_off = int(self._raw[n - 1]), int(self._off[n - 1])
            band = int((raw - prev_raw) * MAX_DRIFT)
            off = min(max(off, prev_off - band), prev_off + band)
        if n == len(self._raw):
            self._raw = np.concatenate((self._raw, np.zeros(n, np.int64)))
            self._off = np.concatenate((self._off, np.zeros(n, np.int64)))
        self._raw[n], self._off[n] = raw, off
        self._n = n + 1

    def offsets(self) -> npt.NDArray[np.int64]:
        """The offsets (mono - raw) of the points kept so far."""
        return self._off[: self._n].copy()

    def snapshot(self) -> RawMap:
        """The map through the points so far; those points become final."""
        self._sealed = self._n
        # views: add() writes past _n or into a new array, never into these
        return RawMap(self._raw[: self._n], self._off[: self._n])


class RawMap:
    """The piecewise-linear raw -> mono map through fixed points."""

    def __init__(self, raw: npt.NDArray[np.int64], off: npt.NDArray[np.int64]) -> None:
        self.raw, self.off = raw, off

    @classmethod
    def constant(cls, offset: int) -> RawMap:
        """One fixed offset for every raw time (tests, decoding saved bytes)."""
        return cls(np.zeros(1, np.int64), np.array([offset], np.int64))

    def __call__(self, raw: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
        """CLOCK_MONOTONIC of each CLOCK_MONOTONIC_RAW time in `raw`."""
        a = np.asarray(raw)
        r: npt.NDArray[np.int64] = (a.view(np.int64) if a.dtype == np.uint64
                                    else a.astype(np.int64, copy=False))
        pr, po = self.raw, self.off
        if len(pr) == 1:
            out: npt.NDArray[np.int64] = r + po[0]
            return out
        i = np.clip(np.searchsorted(pr, r, side="right") - 1, 0, len(pr) - 2)
        r0, dr = pr[i], pr[i + 1] - pr[i]
        frac = np.clip((r - r0) / dr, 0.0, 1.0)
        off = po[i] + np.rint(frac * (po[i + 1] - po[i])).astype(np.int64)
        res: npt.NDArray[np.int64] = r + off
        return res
