"""When does an NVIDIA device file description lose its last reference?

The RM frees the clients a control fd holds when the file is released, which
is at the last close of its open file description, not at the first close of
one of its fds: `dup` adds a reference, `close` drops one. Replaying the
`files` table (open, seen, dup, close rows) per process gives each fd a file
description id (`ofd`) and each description the time it was released.

A close of an fd whose history the trace does not hold (opened before
recording without a `seen` row, or inherited across fork) is taken as the
last reference. Fds still open at process exit are released by the exit,
which the leak report handles through the processes table.
"""

from __future__ import annotations

import polars as pl

OPEN, CLOSE, DUP, SEEN = 1, 2, 3, 4
DEFS = {"pid": pl.Int32, "fd": pl.Int32, "ts_ns": pl.Int64, "ofd": pl.Int64}
RELEASES = {"pid": pl.Int32, "ofd": pl.Int64, "release_ts_ns": pl.Int64}


def file_descriptions(files: pl.LazyFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(defs, releases): when each (pid, fd) came to name description `ofd`, and
    when each description lost its last reference."""
    rows = (files.select("ts_ns", "pid", "fd_op_code", "fd", "new_fd")
            .sort("ts_ns", maintain_order=True).collect())
    # Few rows (opens and closes are rare next to ioctls): a plain replay is clearest.
    current: dict[tuple[int, int], int] = {}
    ended: dict[tuple[int, int], int] = {}  # when each fd last stopped naming anything
    refs: dict[int, int] = {}
    defs: list[tuple[int, int, int, int]] = []
    releases: list[tuple[int, int, int]] = []

    def define(pid: int, fd: int, ts: int, ofd: int) -> None:
        current[(pid, fd)] = ofd
        refs[ofd] = refs.get(ofd, 0) + 1
        defs.append((pid, fd, ts, ofd))

    def drop(pid: int, fd: int, ts: int) -> None:
        ofd = current.pop((pid, fd), None)
        if ofd is None:  # unknown history: it named one description since it last ended
            ofd = len(defs)
            defs.append((pid, fd, ended.get((pid, fd), -1), ofd))
            refs[ofd] = 1
        ended[(pid, fd)] = ts
        refs[ofd] -= 1
        if refs[ofd] == 0:
            releases.append((pid, ofd, ts))

    for ts, pid, op, fd, new_fd in rows.iter_rows():
        if op in (OPEN, SEEN):
            if (pid, fd) in current:
                drop(pid, fd, ts)
            define(pid, fd, ts, len(defs))
        elif op == DUP and new_fd is not None:
            src = current.get((pid, fd))
            if src is None:
                define(pid, fd, ts, src := len(defs))
            if (pid, new_fd) in current:
                drop(pid, new_fd, ts)
            define(pid, new_fd, ts, src)
        elif op == CLOSE:
            drop(pid, fd, ts)
    return (pl.DataFrame(defs, schema=DEFS, orient="row"),
            pl.DataFrame(releases, schema=RELEASES, orient="row"))


def release_of(calls: pl.LazyFrame,
               descriptions: tuple[pl.DataFrame, pl.DataFrame]) -> pl.LazyFrame:
    """`calls` (ts_ns, pid, fd, ...) plus `release_ts_ns`: when the file description
    the call's fd named at that time was released (null: not in the trace).
    `descriptions` is `file_descriptions(files)`, replayed once for all callers."""
    defs, releases = descriptions
    named = (calls.sort("ts_ns")
             .join_asof(defs.lazy().sort("ts_ns").rename({"ts_ns": "_def_ts"}),
                        left_on="ts_ns", right_on="_def_ts", by=["pid", "fd"],
                        strategy="backward", check_sortedness=False))
    return (named.join(releases.lazy(), on=["pid", "ofd"], how="left")
            .with_columns(release_ts_ns=pl.when(pl.col("release_ts_ns") >= pl.col("ts_ns"))
                          .then("release_ts_ns"))
            .drop("_def_ts", "ofd"))
