"""Time each `gputrace analyze` report, and the same leak pairing and ioctl summary in
DuckDB SQL, on one trace. Each measurement runs in a fresh process, so its peak RSS
(ru_maxrss, interpreter included) is its own.

    python benchmarks/analyze/gen.py /tmp/t10m --events 10_000_000
    python benchmarks/analyze/bench.py /tmp/t10m
    python benchmarks/analyze/bench.py /tmp/t10m polars_pairing,duckdb_pairing

"M events/s" is events per wall second and "M ev/CPU s" per CPU second (ioctl rows
for the pairing and ioctl-summary cases, every event otherwise). When a polars case
and its DuckDB twin both ran, a ratio line (polars / DuckDB, wall and CPU) follows:
the target is at most 1.0.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from typing import Any

PAIR_SQL = """
WITH io AS (SELECT * FROM read_parquet('{t}/ioctls/*.parquet')
            WHERE coalesce(status, 0) = 0 AND coalesce(ret, 0) >= 0),
a AS (SELECT row_number() OVER () AS aid, pid, h_client, h_object, ts_ns, size_bytes
      FROM io WHERE name = 'RM_ALLOC'),
f AS (SELECT pid, h_client, h_object, ts_ns AS free_ts FROM io WHERE name = 'RM_FREE'),
m AS (SELECT a.aid, min(f.free_ts) AS free_ts FROM f ASOF JOIN a
      ON f.pid = a.pid AND f.h_client = a.h_client AND f.h_object = a.h_object
      AND f.free_ts >= a.ts_ns GROUP BY a.aid)
SELECT count(*) AS allocs, count(m.free_ts) AS freed,
       sum(CASE WHEN m.free_ts IS NULL THEN a.size_bytes END)::BIGINT AS unfreed_bytes
FROM a LEFT JOIN m USING (aid)
"""
SUMMARY_SQL = """
SELECT device, gpu_index, name, count(*) AS count,
       sum(CASE WHEN coalesce(status, 0) <> 0 OR coalesce(ret, 0) < 0 THEN 1 ELSE 0 END) AS failed,
       sum(latency_ns) AS total_ns, quantile_disc(latency_ns, [0.5, 0.9, 0.99]) AS q,
       max(latency_ns) AS max_ns
FROM read_parquet('{t}/ioctls/*.parquet') GROUP BY ALL ORDER BY total_ns DESC
"""
SQL_CASES = ["polars_pairing", "duckdb_pairing", "polars_ioctl_summary", "duckdb_ioctl_summary"]
"""Besides these, one case per registered report (its CLI name) and `all_reports`."""


def all_cases() -> list[str]:
    from gputrace.analyses import registry

    return [*SQL_CASES, *registry.names(), "all_reports"]


def one(case: str, trace: str) -> dict[str, Any]:
    import polars as pl

    from gputrace import open_trace
    from gputrace.analyses.helpers.common import ok_ioctl
    from gputrace.analyses.helpers.inputs import inputs_from_trace
    from gputrace.analyses.helpers.pairing import pair

    inp = inputs_from_trace(open_trace(trace))
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    cpu0 = ru0.ru_utime + ru0.ru_stime
    t = time.perf_counter()
    result: Any = None
    if case == "polars_pairing":
        io = inp.scan("ioctls").filter(ok_ioctl())
        key = ["pid", "h_client", "h_object"]
        lt = pair(io.filter(pl.col("name") == "RM_ALLOC"), io.filter(pl.col("name") == "RM_FREE"),
                  key)
        df = lt.select(pl.len().alias("allocs"), pl.col("free_ts_ns").count().alias("freed"),
                       pl.col("size_bytes").filter(pl.col("free_ts_ns").is_null()).sum()
                       .cast(pl.Int64).alias("unfreed_bytes")).collect()
        result = df.row(0)
    elif case.startswith("duckdb"):
        import duckdb

        con = duckdb.connect()
        con.execute("SET threads = 2")
        sql = PAIR_SQL if case == "duckdb_pairing" else SUMMARY_SQL
        rows = con.execute(sql.format(t=trace)).fetchall()
        result = rows[0] if case == "duckdb_pairing" else len(rows)
    elif case == "polars_ioctl_summary":
        from gputrace.analyses.summary import ioctl_stats

        result = ioctl_stats(inp.scan("ioctls"), inp.ioctl_commands).collect().height
    else:
        from gputrace.analyses.run import run_reports

        run_reports(inp, None if case == "all_reports" else [case])
    wall = time.perf_counter() - t
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return {"case": case, "wall_s": round(wall, 2), "peak_rss_mib": round(ru.ru_maxrss / 1024),
            "cpu_s": round(ru.ru_utime + ru.ru_stime - cpu0, 2), "result": result}


def main() -> None:
    if sys.argv[1] == "--one":
        print(json.dumps(one(sys.argv[2], sys.argv[3]), default=str))
        return
    trace = sys.argv[1]
    from gputrace import open_trace

    tr = open_trace(trace)
    rows = {n: tr.rows(n) for n in ("ioctls", "cuda_calls", "faults", "migrations", "chunks")}
    total = sum(rows.values())
    print(f"trace {trace}: {total:,} events ({', '.join(f'{k} {v:,}' for k, v in rows.items())})")
    print(f"{'case':<22}{'wall s':>9}{'cpu s':>8}{'peak RSS MiB':>14}{'M events/s':>12}"
          f"{'M ev/CPU s':>12}  result")
    cases = sys.argv[2].split(",") if len(sys.argv) > 2 else all_cases()
    done: dict[str, dict[str, Any]] = {}
    for case in cases:
        out = subprocess.run([sys.executable, __file__, "--one", case, trace],
                             capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        n = rows["ioctls"] if "pairing" in case or "ioctl" in case else total
        rate = n / r["wall_s"] / 1e6 if r["wall_s"] else float("inf")
        cpu_rate = n / r["cpu_s"] / 1e6 if r["cpu_s"] else float("inf")
        print(f"{case:<22}{r['wall_s']:>9.2f}{r['cpu_s']:>8.2f}{r['peak_rss_mib']:>14,}"
              f"{rate:>12.1f}{cpu_rate:>12.1f}  "
              f"{r['result'] if r['result'] is not None else ''}", flush=True)
        done[case] = r
    for what in ("pairing", "ioctl_summary"):
        p, d = done.get(f"polars_{what}"), done.get(f"duckdb_{what}")
        if p and d and d["wall_s"] and d["cpu_s"]:
            same = "same result" if p["result"] == d["result"] else "RESULTS DIFFER"
            print(f"ratio polars/DuckDB {what}: wall {p['wall_s'] / d['wall_s']:.2f}, "
                  f"cpu {p['cpu_s'] / d['cpu_s']:.2f} ({same})")


if __name__ == "__main__":
    main()
