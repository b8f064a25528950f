"""--alert parsing and episodes: fires once per episode, re-arms when the
condition ends, one stderr line, one alerts row, --on-alert with the details in
the environment only. Synthetic data (gputrace.trace.builder)."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from gputrace import schema
from gputrace.errors import UsageError
from gputrace.live.aggregates import NS, Aggregates
from gputrace.live.alerts import KILL_GRACE_S, MAX_CHILDREN, Alerts, parse_alert
from gputrace.trace.builder import MiB, TraceBuilder
from tests.unit.live.test_live_aggregates import Clock, feed


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


@pytest.mark.parametrize("text", ["alloc_rate>\u0661\u0662/s", "alloc_rate>1_000/s",
                                  "migration_rate>\uff11\uff12/min", "leak_rate>1_000MiB/s",
                                  "live_bytes>\u0661GiB", "drops>1_0", "alloc_rate>12/\u0661s"])
def test_only_ascii_digits_are_numbers(text: str) -> None:
    """As every other option: Arabic-Indic or full-width digits and underscores are
    refused, never read as 12 or 1000."""
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


@pytest.mark.parametrize("text", ['a "b', "notify 'ops", "notify \\"])
def test_on_alert_that_cannot_be_split_is_a_usage_error(text: str) -> None:
    """An unclosed quote or a trailing backslash in --on-alert was shlex's ValueError
    (a traceback); it is a usage error naming the option."""
    with pytest.raises(UsageError, match="--on-alert: cannot split"):
        Alerts([parse_alert("drops>0")], on_alert=text)


def _gone(pid: int) -> bool:
    """Has this process exited (gone, or a zombie nobody reaped yet)?"""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_on_alert_storm_is_capped_and_exit_is_bounded(tmp_path: Path) -> None:
    """Guards against an alert storm: every firing started its --on-alert command
    with no cap, and exit waited 5 s for each in turn (23 episodes: the recorder ended
    2 minutes after its command). Now at most MAX_CHILDREN run at once, further
    firings run none and are counted, and exit waits for all of them together for
    one deadline, then ends each one's process group (its own children too)."""
    pids = tmp_path / "pids"
    agg = Aggregates(clock=Clock())
    lines: list[str] = []
    al = Alerts([parse_alert("live_bytes>0")], err=lines.append,
                on_alert=f"sh -c 'sleep 30 & echo $! >> {pids}; wait'")  # fmt: skip
    b = TraceBuilder()  # synthetic: 30 processes, each its own episode at once
    for pid in range(100, 130):
        b.process(pid, f"p{pid}")
        b.cuda_alloc(0.1, pid, MiB)
    feed(agg, b)
    assert len(al.evaluate(agg.snapshot())) == 30
    running = [c for c in al.children if c.poll() is None]
    assert len(running) == MAX_CHILDREN
    assert al.skipped == 30 - MAX_CHILDREN
    deadline = time.monotonic() + 10  # each child has written its sleep's pid
    while len(pids.read_text().split() if pids.exists() else []) < MAX_CHILDREN:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    t0 = time.monotonic()
    al.close(timeout_s=1.0)
    assert time.monotonic() - t0 < 1.0 + 2 * KILL_GRACE_S + 1.0
    assert all(c.poll() is not None for c in running) and al.children == []
    grandchildren = [int(p) for p in pids.read_text().split()]
    deadline = time.monotonic() + 5  # a signal is delivered soon, not at once
    while not all(_gone(p) for p in grandchildren):
        assert time.monotonic() < deadline, [Path(f"/proc/{p}/stat").read_text()
                                             for p in grandchildren if not _gone(p)]
        time.sleep(0.05)
    warnings = [x for x in lines if "--on-alert" in x]
    assert len(warnings) == 3, warnings  # first skip, ended at exit, count of skipped
    assert f"not run for {30 - MAX_CHILDREN} alerts" in warnings[-1]


def test_on_alert_runs_again_once_children_finish() -> None:
    """The cap counts running commands only: a finished one frees its place."""
    drops = {"ioctl_events": 0}
    agg = Aggregates(clock=Clock(), stats=lambda: {"drops": dict(drops)})
    true = shutil.which("true")
    assert true is not None
    al = Alerts([parse_alert("drops>0")], on_alert=true, err=lambda _: None,
                max_children=1)  # fmt: skip
    for n in range(3):
        drops["ioctl_events"] = 1
        assert len(al.evaluate(agg.snapshot())) == 1
        al.children[-1].wait(timeout=10)
        drops["ioctl_events"] = 0  # the episode ends
        assert al.evaluate(agg.snapshot()) == []
        assert al.skipped == 0, n
    al.close()


class _Writer:
    def __init__(self) -> None:
        self.manifest: dict[str, Any] = {}
        self.tables: list[pa.Table] = []

    def update_manifest(self, **fields: Any) -> None:
        self.manifest.update(fields)

    def append(self, name: str, table: pa.Table) -> None:
        self.tables.append(table)


class _Recorder:
    """What live.run needs of a recorder: observers, a writer, run()."""

    def __init__(self, b: TraceBuilder) -> None:
        self.writer = _Writer()
        self.observers: list[Any] = []
        self.b = b

    def add_observer(self, fn: Any) -> None:
        self.observers.append(fn)

    def run(self) -> int:
        for name in schema.TABLES:
            if self.b.rows[name]:
                t = pa.Table.from_pylist(self.b.rows[name],
                                         schema=schema.table(name).arrow_schema)
                for fn in self.observers:
                    fn(name, t)
        return 0


def test_skipped_on_alert_commands_are_counted_in_the_manifest() -> None:
    """A firing whose command did not run (the cap) is not lost silently: the
    manifest counts them (live.on_alert_skipped) next to the expressions."""
    from gputrace.live import LiveOptions, run

    b = TraceBuilder()  # synthetic: 10 episodes at once
    for pid in range(100, 110):
        b.process(pid, f"p{pid}")
        b.cuda_alloc(0.1, pid, MiB)
    rec = _Recorder(b)
    sleep = shutil.which("sleep")
    assert run(rec, LiveOptions(alerts=["live_bytes>0"], on_alert=f"{sleep} 2")) == 0
    assert rec.writer.manifest["live"] == {"alerts": ["live_bytes>0"],
                                           "on_alert_skipped": 10 - MAX_CHILDREN}
    assert len(pa.concat_tables(rec.writer.tables)) == 10  # every alert has its row
