"""One exported trace read back from a dataset as the `Inputs` every analysis takes.

The per-trace reports must say exactly what `gputrace analyze` says of the
trace directory: the tables come back with the trace schema's types (the
fleet columns dropped), and the manifest and the trace's own integrity doubts
are the ones stored at export time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import polars as pl

from gputrace import schema
from gputrace.analyses.helpers.inputs import Inputs, inputs_from_trace
from gputrace.fleet.export import files_problem
from gputrace.fleet.store import DatasetError, Store
from gputrace.trace.reader import ManifestFacts

DEVICE_TABLES = ("chunks", "gpu_memory")
"""Tables a job filter keeps whole: they describe the GPU, not one process."""


class _Exported(ManifestFacts):
    """What `inputs_from_trace` reads of a trace, served from a dataset record."""

    def __init__(self, record: dict[str, Any], frames: Mapping[str, pl.DataFrame]) -> None:
        self.manifest = record["manifest"]
        self._frames = frames

    def scan(self, name: str) -> pl.LazyFrame:
        t = schema.table(name)
        df = self._frames.get(name)
        if df is None:
            return pl.LazyFrame(schema=t.polars_schema)
        # a dataset exported by an older gputrace lacks the nullable columns added
        # since: they read as nulls, as a trace directory's older parts do
        have, nullable = set(df.columns), {c.name for c in t.columns if c.nullable}
        return df.lazy().select([
            pl.col(n).cast(dt) if n in have or n not in nullable else pl.lit(None, dt).alias(n)
            for n, dt in t.polars_schema.items()])


def read_record(store: Store, entry: dict[str, Any]) -> dict[str, Any]:
    """The trace record of an index entry (checked by `read_index`); its files, which
    `read_frames` opens, are checked like the index's."""
    rel = str(entry["record"])
    rec = store.read_json(rel)
    if not isinstance(rec, dict) or not isinstance(rec.get("manifest"), dict):
        raise DatasetError(f"{store.url}/{rel}: not a trace record")
    why = files_problem(str(entry["trace_id"]), rec.get("files", {}))
    if why is not None:
        raise DatasetError(f"{store.url}/{rel}: {why}")
    return rec


def read_frames(store: Store, record: dict[str, Any]) -> dict[str, pl.DataFrame]:
    out: dict[str, pl.DataFrame] = {}
    for name, rel in dict(record.get("files", {})).items():
        if name not in schema.TABLES:
            continue
        df = pl.from_arrow(store.read_parquet(str(rel)))
        assert isinstance(df, pl.DataFrame)
        out[name] = df
    return out


def trace_inputs(record: dict[str, Any], frames: Mapping[str, pl.DataFrame],
                 pids: set[int] | None = None) -> Inputs:
    """Inputs of one exported trace; with `pids`, only those processes' rows (device-wide
    tables stay whole)."""
    if pids is not None:
        keep = pl.Series(sorted(pids), dtype=pl.Int32)
        frames = {n: (df if n in DEVICE_TABLES or "pid" not in df.columns
                      else df.filter(pl.col("pid").is_in(keep)))
                  for n, df in frames.items()}
    inp = inputs_from_trace(_Exported(record, frames))
    stored = tuple(str(p) for p in record.get("problems", []))
    return dataclasses.replace(inp, problems=(*stored, *inp.problems))
