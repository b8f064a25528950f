"""--alert parsing and episodes: fires once per episode, re-arms when the
condition ends, one stderr line, one alerts row, --on-alert with the details in
the environment only. Synthetic data (gputrace.builder)."""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pytest

from gputrace import schema
from gputrace.builder import MiB, TraceBuilder
from gputrace.errors import UsageError
from gputrace.live.aggregates import NS, Aggregates
from gputrace.live.alerts import Alerts, parse_alert
from tests.test_live_aggregates import Clock, feed


@pytest.mark.parametrize(("text", "metric", "op", "threshold"), [
    ("leak_rate>100MiB/min", "leak_rate", ">", 100 * MiB / 60),
    ("leak_rate > 1G/h", "leak_rate", ">", (1 << 30) / 3600),
    ("leak_rate>4096", "leak_rate", ">", 4096.0),
    ("gpu_free<1GiB", "gpu_free", "<", float(1 << 30)),
    ("fragmentation>0.5", "fragmentation", ">", 0.5),
    ("gpu_fault_rate>1e6/s", "gpu_fault_rate", ">", 1e6),
    ("alloc_rate>=600/min", "alloc_rate", ">=", 10.0),
    ("drops>0", "drops", ">", 0.0),
])  # fmt: skip
def test_parse(text: str, metric: str, op: str, threshold: float) -> None:
    r = parse_alert(text)
    assert (r.metric, r.op) == (metric, op)
    assert r.threshold == pytest.approx(threshold)


@pytest.mark.parametrize("text", ["leak_rate", "nope>1", "gpu_free<lots", "fragmentation>2",
                                  "drops>-1", "leak_rate>1MiB/fortnight", "gpu_fault_rate>x/s",
                                  "gpu_fault_rate>nan/s"])
def test_parse_rejects(text: str) -> None:
    with pytest.raises(UsageError, match="--alert"):
        parse_alert(text)


def test_fires_once_per_episode_and_rearms() -> None:
    clock = Clock()
    agg = Aggregates(clock=clock, growth_window_ns=60 * NS)
    lines: list[str] = []
    tables: list[pa.Table] = []
    al = Alerts([parse_alert("leak_rate>10MiB/min")], write=tables.append, err=lines.append)
    b = TraceBuilder()  # synthetic
    b.process(42, "leaky")
    b.process(43, "steady")
    for i in range(20):
        b.cuda_alloc(0.1 * i, 42, MiB)
    p = b.cuda_alloc(0.1, 43, 64 * MiB)
    b.cuda_free(0.2, 43, p)
    feed(agg, b)
    assert [f.pid for f in al.evaluate(agg.snapshot())] == [42]
    clock.t += NS
    b.cuda_alloc(3.0, 42, MiB)
    feed(agg, b)
    assert al.evaluate(agg.snapshot()) == []  # same episode
    clock.t += 120 * NS  # growth back to 0: the episode ends
    assert al.evaluate(agg.snapshot()) == []
    for i in range(20):
        b.cuda_alloc(130 + i, 42, MiB)
    feed(agg, b)
    assert [f.pid for f in al.evaluate(agg.snapshot())] == [42]  # a new episode
    assert len(lines) == 2 and lines[0].startswith("gputrace: alert: leak_rate>10MiB/min: "
                                                   "pid 42 (leaky): leak_rate = ")
    rows = pa.concat_tables(tables).to_pylist()
    assert [r["pid"] for r in rows] == [42, 42]
    assert rows[0]["alert"] == "leak_rate" and rows[0]["comm"] == "leaky"
    assert rows[0]["value"] == pytest.approx(20 * MiB / 60)
    assert rows[0]["threshold"] == pytest.approx(10 * MiB / 60)
    assert pa.concat_tables(tables).schema.equals(schema.ALERTS.arrow_schema)


def test_gpu_and_drops_alerts() -> None:
    drops = {"ioctl_events": 0}
    agg = Aggregates(clock=Clock(), stats=lambda: {"drops": dict(drops)})
    al = Alerts([parse_alert("gpu_free<1GiB"), parse_alert("fragmentation>0.5"),
                 parse_alert("drops>0")], err=lambda _: None)  # fmt: skip
    b = TraceBuilder(gpus=2)  # synthetic
    b.gpu_memory(0.1, 0, heap=80 << 30, free=512 * MiB, largest=100 * MiB)
    b.gpu_memory(0.1, 1, heap=80 << 30, free=40 << 30, largest=39 << 30)
    feed(agg, b)
    got = {(f.rule.metric, f.gpu_index) for f in al.evaluate(agg.snapshot())}
    assert got == {("gpu_free", 0), ("fragmentation", 0)}
    drops["ioctl_events"] = 3
    (f,) = al.evaluate(agg.snapshot())
    assert (f.rule.metric, f.value, f.pid, f.gpu_index) == ("drops", 3.0, None, None)


def test_on_alert_gets_details_in_env_not_argv(tmp_path: Path) -> None:
    out = tmp_path / "env.txt"
    script = tmp_path / "hook.py"
    script.write_text("import os, sys\n"
                      "with open(sys.argv[1], 'w') as f:\n"
                      "    for k in sorted(os.environ):\n"
                      "        if k.startswith('GPUTRACE_ALERT_'):\n"
                      "            f.write(f'{k}={os.environ[k]}\\n')\n"
                      "    f.write('ARGV=' + repr(sys.argv[1:]) + '\\n')\n")
    agg = Aggregates(clock=Clock())
    evil = "$(touch pwned);x"  # a process name is traced text: it must stay data
    al = Alerts([parse_alert("live_bytes>0")], on_alert=f"{sys.executable} {script} {out}",
                err=lambda _: None)
    b = TraceBuilder()  # synthetic
    b.process(77, evil)
    b.cuda_alloc(0.1, 77, MiB)
    feed(agg, b)
    assert len(al.evaluate(agg.snapshot())) == 1
    al.close()
    env = dict(line.split("=", 1) for line in out.read_text().splitlines())
    assert env["GPUTRACE_ALERT_PID"] == "77" and env["GPUTRACE_ALERT_COMM"] == evil
    assert env["GPUTRACE_ALERT_NAME"] == "live_bytes"
    assert float(env["GPUTRACE_ALERT_VALUE"]) == MiB
    assert env["ARGV"] == repr([str(out)])
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()


def test_on_alert_needs_a_command() -> None:
    with pytest.raises(UsageError):
        Alerts([parse_alert("drops>0")], on_alert="  ")
