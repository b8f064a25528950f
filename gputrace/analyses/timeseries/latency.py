"""How long do the busiest driver calls (ioctls) take?

A histogram per command over log-spaced latency buckets, 4 per decade.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from gputrace.analyses.helpers.inputs import Inputs

LATENCY_EDGES_US = [10.0 ** (e / 4) for e in range(-4, 29)]
"""Latency histogram bucket edges: 4 per decade from 0.1 us to 10 s."""


LATENCY_COMMANDS = 8


def latency_histograms(inp: Inputs) -> dict[str, Any]:
    """ioctl latency distribution of the busiest commands: counts per log-spaced bucket,
    bucket i holding latencies from `from_us[i]` (0 for the first) to `edges_us[i]`."""
    if not inp.has("syscall"):
        return {"recorded": False, "edges_us": LATENCY_EDGES_US, "commands": [],
                "from_us": []}
    edges_ns = [e * 1000 for e in LATENCY_EDGES_US]
    io = (inp.scan("ioctls").filter(pl.col("latency_ns").is_not_null())
          .select(pl.col("name").fill_null("?"), "latency_ns"))
    top = (io.group_by("name").agg(n=pl.len()).sort(["n", "name"], descending=[True, False])
           .head(LATENCY_COMMANDS).collect())
    names = list(top["name"])
    df = (io.filter(pl.col("name").is_in(names))
          # bucket i: latencies in [edge i-1, edge i); bucket 0 below the first edge
          .with_columns(_b=pl.sum_horizontal([(pl.col("latency_ns") >= e).cast(pl.Int64)
                                              for e in edges_ns]))
          .group_by("name", "_b").agg(n=pl.len()).collect())
    cmds = []
    for name in names:
        counts = [0] * (len(edges_ns) + 1)
        for b, n in df.filter(pl.col("name") == name).select("_b", "n").iter_rows():
            counts[int(b)] = int(n)
        cmds.append({"name": name, "counts": counts})
    return {"recorded": True, "edges_us": LATENCY_EDGES_US, "commands": cmds,
            "from_us": [LATENCY_EDGES_US[0] / 10, *LATENCY_EDGES_US]}
