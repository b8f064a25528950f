"""GPU fault batches still open across drains: a batch's faults arrive in one or more
drains and it closes at its replay event, so its fault count, duplicates and first
fault time are kept as running totals until then.

Open batches are kept as running totals per batch (faults, distinct
address/access pairs, first fault time), so a drain costs the same however many
batches are open. A batch's distinct pairs are kept too, in the part of the drain
it last appeared in, and read back only when more of its faults arrive in a later
drain (its duplicates may span drains). Used by `decode_uvm.UvmStreamDecoder`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from gputrace.record.uvm_tools.clock import RawMap
from gputrace.record.uvm_tools.records import Records

_U8, _U40, _U32, _BYTE = np.uint64(8), np.uint64(40), np.uint64(32), np.uint64(0xFF)
_EMPTY_U64 = np.empty(0, np.uint64)
_COUNT, _DISTINCT, _FIRST, _PART = range(4)
"""Columns of the open batches' totals (`OpenBatches._totals`)."""


def batch_key(ev: Records) -> Any:
    """Each record's batch key: gpu << 40 | client type << 32 | batch id."""
    return ((ev["gpu"].astype(np.uint64) << _U40)
            | (ev["client_type"].astype(np.uint64) << _U32)
            | ev["batch"].astype(np.uint64))


def split_key(rkey: Any) -> tuple[Any, Any, Any]:
    """Batch keys back to (tools GPU index, client type, batch id)."""
    return ((rkey >> _U40).astype(np.int64), ((rkey >> _U32) & _BYTE).astype(np.int64),
            (rkey & np.uint64(0xFFFFFFFF)).astype(np.uint32))


class OpenBatches:
    """The batches of one tools queue whose replay has not been seen yet."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget every open batch."""
        # open batches, sorted by key (gpu << 40 | client type << 32 | batch id), and per
        # batch a row of totals (_COUNT, _DISTINCT, _FIRST, _PART): fault count, distinct
        # (address, access) pairs, first fault time, the id of the part holding its
        # distinct pairs
        self._okey: npt.NDArray[np.uint64] = _EMPTY_U64
        self._totals: npt.NDArray[np.int64] = np.empty((0, 4), np.int64)
        # part id -> [pair keys (key << 8 | access), addresses] sorted, open batches in it
        self._parts: dict[int, list[Any]] = {}
        self._next_part = 0

    def add(self, f: Records, off: RawMap) -> None:
        """Fold a drain's GPU faults into the open batches' totals."""
        pair = (batch_key(f) << _U8) | f["access"].astype(np.uint64)
        addr = f["address"]
        order = np.lexsort((addr, pair))
        pair, addr = pair[order], addr[order]
        n = len(pair)
        new_pair = np.empty(n, bool)  # first of its (key, access, address) in the drain
        new_pair[0] = True
        np.not_equal(pair[1:], pair[:-1], out=new_pair[1:])
        new_pair[1:] |= addr[1:] != addr[:-1]
        skey = pair >> _U8
        start = np.flatnonzero(skey[1:] != skey[:-1])
        start += 1
        start = np.concatenate(([0], start))
        add = np.empty((len(start), 4), np.int64)
        add[:-1, _COUNT] = start[1:] - start[:-1]
        add[-1, _COUNT] = n - start[-1]
        add[:, _DISTINCT] = np.add.reduceat(new_pair, start, dtype=np.int64)
        add[:, _FIRST] = np.minimum.reduceat(f["ts"].view(np.int64)[order], start)
        add[:, _FIRST] = off(add[:, _FIRST])
        add[:, _PART] = self._next_part
        keys = skey[start]
        pair, addr = pair[new_pair], addr[new_pair]
        self._next_part += 1
        okey, o = self._okey, self._totals
        if not len(okey) or keys[0] > okey[-1]:  # the usual case: only new batches
            self._okey = np.concatenate((okey, keys))
            self._totals = np.concatenate((o, add))
            self._parts[int(add[0, _PART])] = [pair, addr, len(keys)]
            return
        pos = np.searchsorted(okey, keys)
        known = okey[np.minimum(pos, len(okey) - 1)] == keys
        if known.any():  # batches already open: their pairs join this drain's
            p = pos[known]
            merged_pair, merged_addr, merged_distinct = self._merge_pairs(
                keys[known], p, pair, addr)
            was = o[p]
            was[:, _COUNT] += add[known, _COUNT]
            np.minimum(was[:, _FIRST], add[known, _FIRST], out=was[:, _FIRST])
            was[:, _DISTINCT] = merged_distinct
            self._release(was[:, _PART])
            was[:, _PART] = self._next_part
            o[p] = was
            self._parts[self._next_part] = [merged_pair, merged_addr, len(p)]
            self._next_part += 1
        new = ~known
        n_new = int(np.count_nonzero(new))
        if n_new:
            allk = np.concatenate((okey, keys[new]))
            order = np.argsort(allk, kind="stable")
            self._okey = allk[order]
            self._totals = np.concatenate((o, add[new]))[order]
            self._parts[int(add[0, _PART])] = [pair, addr, n_new]

    def close(self, rkey: Any, rts: Any) -> tuple[Any, Any, Any, Any]:
        """Close the batches `rkey` (sorted, distinct) whose replay came at CPU times
        `rts`: per key its fault count, duplicates, first fault time (the replay's
        when none of its faults was seen) and whether any of its faults was seen."""
        okey = self._okey
        if len(okey):
            pos = np.minimum(np.searchsorted(okey, rkey), len(okey) - 1)
            has = okey[pos] == rkey
        else:
            pos, has = np.zeros(len(rkey), np.intp), np.zeros(len(rkey), bool)
        count = np.zeros(len(rkey), np.int64)
        dups = np.zeros(len(rkey), np.int64)
        fts = rts.copy()
        if has.any():
            p = pos[has]
            o = self._totals[p]
            count[has] = o[:, _COUNT]
            dups[has] = o[:, _COUNT] - o[:, _DISTINCT]
            fts[has] = o[:, _FIRST]
            self._close_at(p)
        return count, dups, fts, has

    def flush(self) -> tuple[Any, Any, Any, Any]:
        """Close every open batch (no replay seen): keys, first fault time, fault count,
        duplicates."""
        keys, o = self._okey, self._totals
        self.reset()
        return keys, o[:, _FIRST], o[:, _COUNT], o[:, _COUNT] - o[:, _DISTINCT]

    def _merge_pairs(self, keys: npt.NDArray[np.uint64], pos: npt.NDArray[np.intp],
                     pair: npt.NDArray[np.uint64], addr: npt.NDArray[np.uint64]
                     ) -> tuple[Any, Any, Any]:
        """The distinct pairs of open batches `keys` (at `pos`) that got more faults:
        those kept from earlier drains and this drain's (`pair`/`addr`, sorted)."""
        ps, ads = [], []
        for k, part in zip(keys.tolist(), self._totals[pos, _PART].tolist(), strict=True):
            lo_hi = np.array([k << 8, (k << 8) | 0xFF], np.uint64)
            for pp, aa in ((pair, addr), self._parts[part][:2]):
                lo, hi = int(np.searchsorted(pp, lo_hi[0], "left")), int(
                    np.searchsorted(pp, lo_hi[1], "right"))
                ps.append(pp[lo:hi])
                ads.append(aa[lo:hi])
        mp, ma = np.concatenate(ps), np.concatenate(ads)
        order = np.lexsort((ma, mp))
        mp, ma = mp[order], ma[order]
        keep = np.ones(len(mp), bool)
        np.not_equal(mp[1:], mp[:-1], out=keep[1:])
        keep[1:] |= ma[1:] != ma[:-1]
        mp, ma = mp[keep], ma[keep]
        start = np.searchsorted(mp >> _U8, keys)
        return mp, ma, np.append(start[1:], len(mp)) - start

    def _release(self, parts: npt.NDArray[np.int64]) -> None:
        """Open batches left the parts `parts` (one entry per batch)."""
        ids, n = np.unique(parts, return_counts=True)
        for i, c in zip(ids.tolist(), n.tolist(), strict=True):
            part = self._parts[i]
            part[2] -= c
            if part[2] <= 0:
                del self._parts[i]

    def _close_at(self, pos: npt.NDArray[np.intp]) -> None:
        """Forget the open batches at `pos` (their replay came)."""
        self._release(self._totals[pos, _PART])
        keep = np.ones(len(self._okey), bool)
        keep[pos] = False
        self._okey, self._totals = self._okey[keep], self._totals[keep]
