"""When did each RM memory object die, counting the deaths RM causes itself?

RM objects form a tree (client -> device -> subdevice/memory ...). An object
ends at the first of: its own RM_FREE; the free of its parent or of any
ancestor (freeing a parent frees the subtree); the free of its client; the
release of the control fd its client was allocated on (last close of that file
description, from the `files` table; helpers.fds), which frees every client that
fd still holds (docs/driver-facts.md §2.3). When the client's allocation is not
in the trace, the object's own fd stands in for it. A process exit closes its fds,
so memory still held at exit is reclaimed by teardown (`unfreed_at_exit`).

Memory objects are those of the physical memory classes below and
RM_VID_HEAP_CONTROL allocations. Virtual reservations (NV50_MEMORY_VIRTUAL
0x50A0, NV01_MEMORY_VIRTUAL 0x70, or the NVOS32 VIRTUAL flag) hold no memory:
they are returned separately and never reported as leaked memory.
"""

from __future__ import annotations

import polars as pl

from gputrace.analyses.helpers.common import ok_ioctl
from gputrace.analyses.helpers.fds import file_descriptions, release_of
from gputrace.analyses.helpers.pairing import pair
from gputrace.nvabi import MEMORY_CLASSES, NVOS32_ALLOC_FLAGS_VIRTUAL, VIRTUAL_CLASSES

ALLOCS = ("RM_ALLOC", "RM_ALLOC_MEMORY")
VID_HEAP = "RM_VID_HEAP_CONTROL"
MAX_DEPTH = 8
VIRTUAL_LAYER = "rm-virtual"
KEY = ["pid", "client", "handle"]


def _first_after(objs: pl.LazyFrame, events: pl.LazyFrame, by: list[str], name: str,
                 ) -> pl.LazyFrame:
    """Add `name`: time of the first event with equal `by` at or after each alloc."""
    ev = events.select(*by, pl.col("ts_ns").alias(name)).drop_nulls(by).sort(name)
    return objs.sort("ts_ns").join_asof(ev, left_on="ts_ns", right_on=name, by=by,
                                        strategy="forward", check_sortedness=False)


def _fd_release(base: pl.LazyFrame, files: pl.LazyFrame) -> pl.LazyFrame:
    """(_oid, _close): release of the fd of each object's client (else its own fd)."""
    descs = file_descriptions(files)
    own = release_of(base.select("_oid", "ts_ns", "pid", "fd", "client"), descs)
    clients = release_of(base.filter(pl.col("handle") == pl.col("client"))
                         .select("ts_ns", "pid", "client", "fd"), descs)
    clients = clients.select(pl.col("ts_ns").alias("_cts"), "pid", "client",
                             pl.col("release_ts_ns").alias("_crel")).sort("_cts")
    return (own.sort("ts_ns")
            .join_asof(clients, left_on="ts_ns", right_on="_cts", by=["pid", "client"],
                       strategy="backward", check_sortedness=False)
            .select("_oid", _close=pl.when(pl.col("_cts").is_not_null()).then("_crel")
                    .otherwise("release_ts_ns")))


def rm_objects(ioctls: pl.LazyFrame, files: pl.LazyFrame) -> pl.LazyFrame:
    """Every RM object instance with its end time (`end_ts_ns`) and cause (`freed_by`)."""
    ok = ioctls.filter(ok_ioctl())
    heap_alloc = (pl.col("name") == VID_HEAP) & (pl.col("size_bytes").fill_null(0) > 0)
    allocs = ok.filter(pl.col("name").is_in(ALLOCS) | heap_alloc).select(
        "ts_ns", "pid", "tid", "latency_ns", "comm", "fd", "gpu_index", "size_bytes", "flags",
        "name",
        pl.col("h_client").alias("client"), pl.col("h_object").alias("handle"),
        pl.col("h_parent").alias("parent"), pl.col("h_class").alias("cls"))
    frees = ok.filter((pl.col("name") == "RM_FREE")
                      | ((pl.col("name") == VID_HEAP) & ~heap_alloc)).select(
        "ts_ns", "pid", pl.col("h_client").alias("client"), pl.col("h_object").alias("handle"))

    # Materialized once, in time order; look-ups only see keys some object has.
    base = pair(allocs, frees, KEY).with_row_index("_oid").sort("ts_ns").collect().lazy()
    pkey = ["pid", "client", "parent"]
    pkeys = base.select(pkey).unique()
    objs = _first_after(base, frees.rename({"handle": "parent"}).join(pkeys, on=pkey,
                                                                       how="semi"),
                        pkey, "_parent_free")
    objs = _first_after(objs, frees.filter(pl.col("handle") == pl.col("client")).drop("handle"),
                        ["pid", "client"], "_client_free")
    objs = objs.join(_fd_release(base, files), on="_oid", how="left")
    causes = {"free": "free_ts_ns", "parent": "_parent_free", "client": "_client_free",
              "close": "_close"}
    end = pl.min_horizontal(*causes.values())
    by = pl.lit(None, pl.String)
    for cause, col in reversed(causes.items()):
        by = pl.when(pl.col(col) == end).then(pl.lit(cause)).otherwise(by)
    objs = objs.with_columns(end_ts_ns=end, freed_by=by)

    # Deeper ancestors: the parent instance alive at allocation time, then
    # propagate end = min(end, parent's end) down the tree.
    parents = base.select("pid", "client", pl.col("handle").alias("parent"),
                          pl.col("_oid").alias("_poid"), pl.col("ts_ns").alias("_pts")
                          ).join(pkeys, on=pkey, how="semi")
    objs = objs.sort("ts_ns").join_asof(parents.sort("_pts"), left_on="ts_ns",
                                        right_on="_pts", by=pkey, strategy="backward",
                                        check_sortedness=False)
    # `_prow`: the row of each object's parent instance, so a parent's end is a
    # gather (no join per level); no parent instances at all, nothing to propagate.
    df = objs.collect()
    df = df.with_columns(_prow=df["_oid"].arg_sort().gather(df["_poid"]))
    # Memory is allocated on nvidiactl, so its GPU is its device's (RM_ALLOC of class
    # 0x80 carries the device instance): inherit the nearest ancestor's gpu_index.
    for _ in range(MAX_DEPTH if df["_prow"].null_count() < df.height else 0):
        nxt = df.with_columns(gpu_index=pl.coalesce(
            "gpu_index", pl.col("gpu_index").gather(pl.col("_prow"))))
        if nxt["gpu_index"].null_count() == df["gpu_index"].null_count():
            break
        df = nxt
    for _ in range(MAX_DEPTH if df["_prow"].null_count() < df.height else 0):
        pend = pl.col("end_ts_ns").gather(pl.col("_prow"))
        pend = pl.when(pend >= pl.col("ts_ns")).then(pend)
        earlier = pend < pl.col("end_ts_ns").fill_null(pend + 1)
        nxt = df.with_columns(
            freed_by=pl.when(earlier).then(pl.lit("parent")).otherwise("freed_by"),
            end_ts_ns=pl.min_horizontal("end_ts_ns", pend))
        changed = not nxt["end_ts_ns"].equals(df["end_ts_ns"])
        df = nxt
        if not changed:
            break
    return df.lazy().drop("_oid", "_poid", "_prow", "_pts", "_parent_free", "_client_free",
                          "_close")


def _is_virtual() -> pl.Expr:
    virt_flag = (pl.col("flags").fill_null(0) & NVOS32_ALLOC_FLAGS_VIRTUAL) != 0
    return pl.col("cls").is_in(list(VIRTUAL_CLASSES)) | (
        (pl.col("name") == VID_HEAP) & virt_flag)


LABELS = {c: f"{n} 0x{c:X}" for c, n in {**MEMORY_CLASSES, **VIRTUAL_CLASSES}.items()}
"""The `what` of an RM object of a memory or virtual class, e.g. `sysmem 0x3E` (an
object made by RM_VID_HEAP_CONTROL is `vid heap`)."""


def rm_lifetimes(ioctls: pl.LazyFrame, files: pl.LazyFrame) -> pl.LazyFrame:
    """Lifetime rows of RM memory objects (layer `rm`) and of virtual reservations
    (layer `rm-virtual`, which leaks and summaries report apart)."""
    objs = rm_objects(ioctls, files)
    is_mem = pl.col("cls").is_in(list(MEMORY_CLASSES)) | (pl.col("name") == VID_HEAP)
    what = (pl.when(pl.col("name") == VID_HEAP).then(pl.lit("vid heap"))
            .otherwise(pl.col("cls").replace_strict(LABELS, default="other class",
                                                    return_dtype=pl.String)))
    rows = objs.select(
        pl.when(_is_virtual()).then(pl.lit(VIRTUAL_LAYER)).otherwise(pl.lit("rm"))
        .alias("layer"), "pid", "comm", pl.col("handle").alias("id"),
        what.alias("what"), pl.col("size_bytes").fill_null(0), "name", "cls", "flags",
        pl.col("ts_ns").alias("alloc_ts_ns"), pl.col("end_ts_ns").alias("free_ts_ns"),
        "freed_by", pl.lit(None, pl.Int64).alias("stack_id"), "gpu_index", "tid",
        (pl.col("ts_ns") + pl.col("latency_ns").fill_null(0)).alias("call_end_ns"), "client",
        "handle")
    return rows.filter(is_mem | _is_virtual()).drop("name", "cls", "flags")
