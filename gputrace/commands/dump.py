"""`gputrace dump`: print a table's rows, for eyes or for other tools."""

from __future__ import annotations

import sys
from typing import TextIO

import polars as pl

from gputrace.render.safe import json_ascii_safe, printable
from gputrace.trace.reader import Trace

FORMATS = ("table", "csv", "json")


def dump_table(
    trace: Trace, table: str, *, limit: int | None, fmt: str, out: TextIO | None = None
) -> int:
    """Write rows of `table` in `fmt`; returns the number of rows written.

    `json` writes JSON Lines (one object per row), so output streams and
    concatenates, with C1 controls and bidi/format characters as `\\u` escapes
    (the same strings, harmless on a terminal); `csv` has a header row, its text
    verbatim unless `out` is a terminal (then escaped like `table`); `table` is for
    terminals.
    """
    out = out if out is not None else sys.stdout  # at call time: tests swap sys.stdout
    lf = trace.scan(table)
    if limit is not None:
        lf = lf.head(limit)
    df = lf.collect()
    if fmt == "csv":
        # verbatim for tools; escaped when a terminal would act on the text
        out.write((_printable_strings(df) if _isatty(out) else df).write_csv())
    elif fmt == "json":
        out.write(json_ascii_safe(df.write_ndjson()))
    else:
        df = _printable_strings(df)
        with pl.Config(
            tbl_rows=-1, tbl_cols=-1, tbl_width_chars=250, fmt_str_lengths=60,
            tbl_hide_dataframe_shape=True, thousands_separator=False,
        ):
            out.write(f"{table}: {df.height} rows\n{df}\n")
    return df.height


def _isatty(out: TextIO) -> bool:
    isatty = getattr(out, "isatty", None)
    return bool(isatty()) if callable(isatty) else False


def _printable_strings(df: pl.DataFrame) -> pl.DataFrame:
    """`df` with control characters in its text columns escaped (the `table` format only).

    Text columns hold what traced processes chose (comm, cmdline, symbols), so
    each distinct value goes through `printable`, and those it changes are replaced.
    """
    fixed = []
    for name, dtype in df.schema.items():
        if dtype != pl.String:
            continue
        old = [v for v in df.get_column(name).unique().drop_nulls().to_list()
               if printable(v) != v]
        if old:
            fixed.append(pl.col(name).replace(old, [printable(v) for v in old]))
    return df.with_columns(fixed) if fixed else df
