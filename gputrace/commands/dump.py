"""`gputrace dump`: print a table's rows, for eyes or for other tools."""

from __future__ import annotations

import sys
from typing import TextIO

import polars as pl

from gputrace.tracedir import Trace

FORMATS = ("table", "csv", "json")


def dump_table(
    trace: Trace, table: str, *, limit: int | None, fmt: str, out: TextIO = sys.stdout
) -> int:
    """Write rows of `table` in `fmt`; returns the number of rows written.

    `json` writes JSON Lines (one object per row), so output streams and
    concatenates; `csv` has a header row; `table` is for terminals.
    """
    lf = trace.scan(table)
    if limit is not None:
        lf = lf.head(limit)
    df = lf.collect()
    if fmt == "csv":
        out.write(df.write_csv())
    elif fmt == "json":
        out.write(df.write_ndjson())
    else:
        with pl.Config(
            tbl_rows=-1, tbl_cols=-1, tbl_width_chars=250, fmt_str_lengths=60,
            tbl_hide_dataframe_shape=True, thousands_separator=False,
        ):
            out.write(f"{table}: {df.height} rows\n{df}\n")
    return df.height
