"""Which lifetime rows of different layers are the same piece of memory?

Every memory row of the per-layer lifetimes (api, rm, uvm) is given a `piece`:
the row number of the row its piece is anchored on. The rules, each resting on
evidence in the trace (docs/analyses/allocations.md):

1. handle: an UVM external mapping names the RM memory object it maps
   (UVM_MAP_EXTERNAL_ALLOCATION's hClient, hMemory): same pid, same handle (and
   client when both are known), the object instance alive when it was mapped.
2. address: an API pointer lies in the 2 MiB page of an UVM mapping (external
   mapping or managed mmap) of the same pid that existed when the call returned
   and was not unmapped before the call began.
3. time window: an RM memory object allocated by the same pid and thread while an
   API allocation call ran (between its entry and its return) was made for it.

An RM object anchors its piece; UVM mappings of it and API allocations in it
(several when the driver sub-allocates) join it. An API allocation backed by no
RM object anchors on its UVM mapping when it has one, else on itself. An API
call that made several RM objects keeps the one its pointer maps (else the
largest); the others stay pieces of their own, marked `call_row`.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from gputrace.analyses.helpers.common import BLOCK_2M

MAX_PAGES = 4096
"""2 MiB pages of one mapping an API pointer is looked up in (its first 8 GiB)."""
ROW = "_row"


def _asof(left: pl.DataFrame, right: pl.DataFrame, left_on: str, right_on: str,
          by: list[str]) -> pl.DataFrame:
    return left.sort(left_on).join_asof(right.sort(right_on), left_on=left_on,
                                        right_on=right_on, by=by, strategy="backward",
                                        check_sortedness=False)


def _uvm_to_rm(uvm: pl.DataFrame, rm: pl.DataFrame) -> pl.DataFrame:
    """(uvm _row, rm_row) by rule 1."""
    maps = uvm.filter(pl.col("handle").is_not_null()).select(
        ROW, "pid", "handle", "client", "alloc_ts_ns")
    objs = rm.select(pl.col(ROW).alias("rm_row"), "pid", "handle",
                     pl.col("client").alias("_rc"), pl.col("alloc_ts_ns").alias("_rt"),
                     pl.col("free_ts_ns").alias("_rf"))
    hit = _asof(maps, objs, "alloc_ts_ns", "_rt", ["pid", "handle"])
    ok = (pl.col("rm_row").is_not_null()
          & (pl.col("client").is_null() | pl.col("_rc").is_null()
             | (pl.col("client") == pl.col("_rc")))
          & (pl.col("_rf").is_null() | (pl.col("_rf") >= pl.col("alloc_ts_ns"))))
    return hit.filter(ok).select(ROW, "rm_row")


def _api_to_uvm(api: pl.DataFrame, uvm: pl.DataFrame) -> pl.DataFrame:
    """(api _row, uvm_row) by rule 2."""
    pages = (uvm.select(pl.col(ROW).alias("uvm_row"), "pid", "alloc_ts_ns",
                        pl.col("free_ts_ns").alias("_uf"),
                        first=(pl.col("id") // BLOCK_2M).cast(pl.Int64),
                        n=((pl.col("size_bytes") + BLOCK_2M - 1) // BLOCK_2M)
                        .clip(1, MAX_PAGES).cast(pl.Int64))
             .with_columns(page=pl.int_ranges(pl.col("first"), pl.col("first") + pl.col("n")))
             .explode("page").drop("first", "n"))
    ptrs = api.filter(pl.col("what") != "cuMemCreate").select(
        ROW, "pid", "call_end_ns", "alloc_ts_ns",
        page=(pl.col("id") // BLOCK_2M).cast(pl.Int64))
    hit = _asof(ptrs, pages.rename({"alloc_ts_ns": "_ut"}), "call_end_ns", "_ut",
                ["pid", "page"])
    ok = pl.col("uvm_row").is_not_null() & (
        pl.col("_uf").is_null() | (pl.col("_uf") > pl.col("alloc_ts_ns")))
    return hit.filter(ok).select(ROW, "uvm_row")


def _rm_to_call(rm: pl.DataFrame, api: pl.DataFrame) -> pl.DataFrame:
    """(rm _row, call_row) by rule 3."""
    calls = api.select(pl.col(ROW).alias("call_row"), "pid", "tid",
                       pl.col("alloc_ts_ns").alias("_ct"), "call_end_ns")
    objs = rm.filter(pl.col("tid").is_not_null()).select(ROW, "pid", "tid", "alloc_ts_ns")
    hit = _asof(objs, calls, "alloc_ts_ns", "_ct", ["pid", "tid"])
    return hit.filter(pl.col("alloc_ts_ns") <= pl.col("call_end_ns")).select(ROW, "call_row")


def link(lt: pl.DataFrame) -> pl.DataFrame:
    """`lt` (memory rows of every layer) with `_row`, `piece` and `call_row` (the API
    allocation whose call made an RM object that is not its backing)."""
    lt = lt.with_row_index(ROW).with_columns(pl.col(ROW).cast(pl.Int64))
    # only each layer's evidence columns travel through the joins
    cols = {"api": ["pid", "tid", "id", "what", "alloc_ts_ns", "call_end_ns"],
            "rm": ["pid", "tid", "client", "handle", "size_bytes", "alloc_ts_ns", "free_ts_ns"],
            "uvm": ["pid", "id", "size_bytes", "client", "handle", "alloc_ts_ns", "free_ts_ns"]}
    api, rm, uvm = (lt.lazy().filter(pl.col("layer") == k).select(ROW, *c).collect()
                    for k, c in cols.items())
    none = pl.DataFrame(schema={ROW: pl.Int64, "uvm_row": pl.Int64})
    u2r = _uvm_to_rm(uvm, rm) if uvm.height else none.rename({"uvm_row": "rm_row"})
    a2u = (_api_to_uvm(api, uvm) if uvm.height and api.height else none).join(
        u2r.rename({ROW: "uvm_row"}), on="uvm_row", how="left")
    made_in = (_rm_to_call(rm, api) if rm.height and api.height
               else pl.DataFrame(schema={ROW: pl.Int64, "call_row": pl.Int64}))
    r2c = made_in.join(rm.select(ROW, "size_bytes", "alloc_ts_ns"), on=ROW)
    # an API call's own backing when its pointer maps none: the largest object it made
    made = (r2c.sort("size_bytes", "alloc_ts_ns", descending=[True, False])
            .group_by("call_row", maintain_order=True).agg(pl.col(ROW).first().alias("_made"))
            .rename({"call_row": ROW}))
    # only rows some rule matched can move (the rest stay their own piece)
    api_piece = (pl.concat([a2u.select(ROW), made.select(ROW)]).unique()
                 .join(a2u, on=ROW, how="left").join(made, on=ROW, how="left")
                 .select(ROW, piece=pl.coalesce("rm_row", "_made", "uvm_row", ROW)))
    # a mapping that no RM object backs anchors the API allocations in it
    uvm_piece = u2r.select(ROW, piece="rm_row")
    backing = api_piece.filter(pl.col("piece") != pl.col(ROW)).select("piece").unique()
    calls = r2c.join(backing.rename({"piece": ROW}), on=ROW, how="anti").select(ROW, "call_row")
    # Every row is its own piece unless a rule moved it: scatter the few that moved
    # into full columns (no join of the whole frame).
    piece = np.arange(lt.height, dtype=np.int64)
    moved = pl.concat([api_piece, uvm_piece]).filter(pl.col("piece") != pl.col(ROW))
    piece[moved[ROW].to_numpy()] = moved["piece"].to_numpy()
    call = np.full(lt.height, -1, dtype=np.int64)
    call[calls[ROW].to_numpy()] = calls["call_row"].to_numpy()
    return lt.with_columns(piece=pl.Series(piece),
                           call_row=pl.Series(call).replace(-1, None))
