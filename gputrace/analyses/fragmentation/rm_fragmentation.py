"""How fragmented is each GPU's memory by RM's own samples: at worst, per
allocation size, at the end, and over time? Part of the fragmentation report
(the per-sample measures are gputrace.analyses.fragmentation.gpu_memory's).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from gputrace.analyses.fragmentation import gpu_memory
from gputrace.analyses.helpers.common import records
from gputrace.analyses.helpers.inputs import Inputs


def rm_section(inp: Inputs, warnings: list[str]) -> dict[str, Any]:
    """Per GPU from RM samples: the worst sample (highest unusable share), each share
    column's own maximum over the samples (`max`, with `max_at_s`: the per-size shares
    can peak in another sample than the overall one), the last sample, and the series
    (see gputrace.analyses.fragmentation.gpu_memory)."""
    s, bad = pl.collect_all([gpu_memory.samples(inp.scan("gpu_memory"), inp.start_ns),
                             gpu_memory.failed(inp.scan("gpu_memory"))])
    for r in bad.iter_rows(named=True):
        warnings.append(f"fragmentation: {r['samples']} RM memory queries of GPU "
                        f"{r['gpu_index']} failed (status {r['status']:#x}); those samples "
                        "carry no sizes")
    ser = gpu_memory.series(s, inp.end_ns, inp.start_ns)
    gpus = []
    for g in sorted(set(s["gpu_index"].to_list())):
        mine = s.filter(pl.col("gpu_index") == g).drop("gpu_index", "ts_ns")
        worst = mine.sort("unusable_share", "t_s", descending=[True, False],
                          nulls_last=True).head(1)
        cols = [c for c in mine.columns if c.startswith("unusable_share")]
        top = {c: mine.sort(c, "t_s", descending=[True, False], nulls_last=True).head(1)
               for c in cols}
        gpus.append({"gpu_index": g, "samples": mine.height,
                     "heap_size_bytes": mine["heap_size_bytes"].max(),
                     "min_free_bytes": mine["heap_free_bytes"].min(),
                     "min_largest_free_bytes": mine["largest_free_bytes"].min(),
                     "worst": records(worst)[0],
                     "max": {c: records(f.select(c))[0][c] for c, f in top.items()},
                     "max_at_s": {c: records(f.select("t_s"))[0]["t_s"]
                                  for c, f in top.items()},
                     "end": records(mine.tail(1))[0],
                     "series": records(ser.filter(pl.col("gpu_index") == g)
                                       .drop("gpu_index"))})
    return {"alloc_sizes": {k: v for k, v in gpu_memory.ALLOC_SIZES.items()},
            "failed_samples": int(bad["samples"].sum()) if bad.height else 0, "gpus": gpus}
