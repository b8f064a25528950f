"""When should the person watching be told? `--alert EXPR` conditions, evaluated
on the running aggregates, each firing once per condition episode.

An expression is `METRIC OP VALUE` (OP one of > >= < <=), in the spirit of
`analyze --fail-on`:

- `leak_rate` (each process): live bytes gained over the growth window, per
  second; VALUE a size per time: `100MiB/min`, `1G/h`, `4096/s` (bare: per second)
- `alloc_rate`, `gpu_fault_rate`, `migration_rate` (each process): events per
  second; VALUE a count per time: `1e6/s`, `500/min`
- `live_bytes` (each process: its held bytes, each piece of memory once, the layers
  never added): VALUE a size: `8GiB`
- `orphaned` (each GPU): video memory the driver charges to pids with no live
  traced process (docs/analyses/holders.md); VALUE a size: `1GiB`
- `gpu_free`, `gpu_largest_free` (each GPU, RM samples): VALUE a size: `1GiB`
- `fragmentation` (each GPU): 1 - largest free / free; VALUE a share, 0 to 1
- `drops` (the recording): events lost so far; VALUE a count

An episode of a condition for one subject (a process, a GPU, the recording)
begins when it first holds and ends when it no longer holds or the subject is
gone; the alert fires once, at the beginning. Firing prints one stderr line,
appends one row to the trace's `alerts` table, and runs `--on-alert CMD` (split
like a shell would split it, run without a shell, details in GPUTRACE_ALERT_*
environment variables: traced text such as a process name never reaches a
command line). At most MAX_CHILDREN commands run at once (a firing past that runs
none and is counted); at exit they get CLOSE_TIMEOUT_S in all, then are ended.
"""

from __future__ import annotations

import contextlib
import operator
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pyarrow as pa

from gputrace import schema
from gputrace.errors import UsageError
from gputrace.live.snapshot import Snapshot
from gputrace.options import (
    DURATION_UNITS,
    parse_count,
    parse_duration_ns,
    parse_fraction,
    parse_size,
)
from gputrace.render.safe import printable
from gputrace.units import format_bytes

OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt,
}
PROCESS_RATES = {"leak_rate": "growth_bytes_per_s", "alloc_rate": "alloc_rate",
                 "gpu_fault_rate": "gpu_fault_rate", "migration_rate": "migration_rate"}
SIZES = ("live_bytes", "gpu_free", "gpu_largest_free", "orphaned")
"""Metrics whose VALUE is a size."""
METRICS = (*PROCESS_RATES, *SIZES, "fragmentation", "drops")
_AMOUNT = re.compile(r"\s*(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?\s*", re.ASCII)
_EXPR = re.compile(r"\s*([a-z_]+)\s*(>=|<=|>|<)\s*(.+?)\s*")
ENV_PREFIX = "GPUTRACE_ALERT_"
MAX_CHILDREN = 4
"""--on-alert commands running at once at most: an alert storm must not fork the
host into the ground, nor leave the recorder waiting for hundreds at exit."""
CLOSE_TIMEOUT_S = 5.0
"""How long the recorder waits, in all, for --on-alert commands still running at exit."""
KILL_GRACE_S = 1.0


@dataclass(frozen=True)
class Rule:
    """One parsed `--alert` expression; `threshold` in base units (bytes, /s, share)."""

    text: str
    metric: str
    op: str
    threshold: float

    def holds(self, value: float) -> bool:
        return OPS[self.op](value, self.threshold)


@dataclass(frozen=True)
class Fired:
    """One alert at the start of its episode."""

    ts_ns: int
    rule: Rule
    value: float
    pid: int | None = None
    comm: str | None = None
    gpu_index: int | None = None

    def who(self) -> str:
        if self.pid is not None:
            return f"pid {self.pid} ({printable(self.comm or '?')})"
        if self.gpu_index is not None:
            return f"GPU {self.gpu_index}"
        return "recording"

    def line(self) -> str:
        return (f"gputrace: alert: {self.rule.text}: {self.who()}: "
                f"{self.rule.metric} = {format_value(self.rule.metric, self.value)}")

    def env(self) -> dict[str, str]:
        """The details for --on-alert, one variable each (empty when not applicable)."""
        vals = {"NAME": self.rule.metric, "EXPR": self.rule.text,
                "PID": "" if self.pid is None else str(self.pid), "COMM": self.comm or "",
                "GPU": "" if self.gpu_index is None else str(self.gpu_index),
                "VALUE": repr(self.value), "THRESHOLD": repr(self.rule.threshold),
                "TS_NS": str(self.ts_ns), "MESSAGE": self.line()}
        # a NUL cannot travel in the environment
        return {ENV_PREFIX + k: v.replace("\0", "") for k, v in vals.items()}


def _per_time(text: str, option: str, size: bool) -> float:
    """`100MiB/min` -> bytes per second; `1e6/s` -> events per second."""
    amount, _, per = text.partition("/")
    if size:
        n = float(parse_size(amount, option))
    else:
        try:  # ASCII digits only, as every option (Decimal takes '١٢' and '1_000')
            d = Decimal(amount.strip()) if _AMOUNT.fullmatch(amount) else Decimal(-1)
        except ArithmeticError:
            d = Decimal(-1)
        if not d.is_finite() or d < 0 or d > Decimal(1 << 63):
            raise UsageError(f"{option}: cannot read {amount.strip()!r} as a count per time "
                             "(e.g. 1e6/s, 500/min)")
        n = float(d)
    if not per:
        return n
    per = per.strip()
    if per in DURATION_UNITS:
        per = "1" + per
    ns = parse_duration_ns(per, option)
    return n * 1e9 / ns


def parse_alert(text: str) -> Rule:
    """One `--alert` expression; a usage error names what could not be read."""
    m = _EXPR.fullmatch(text)
    if m is None:
        raise UsageError(f"--alert: cannot read {text!r} (METRIC>VALUE, e.g. "
                         "leak_rate>100MiB/min, gpu_free<1GiB, fragmentation>0.5, drops>0)")
    metric, op, value = m.groups()
    option = f"--alert {metric}"
    if metric == "leak_rate":
        threshold = _per_time(value, option, size=True)
    elif metric in PROCESS_RATES:
        threshold = _per_time(value, option, size=False)
    elif metric in SIZES:
        threshold = float(parse_size(value, option))
    elif metric == "fragmentation":
        threshold = parse_fraction(value, option, below_one=False)
    elif metric == "drops":
        threshold = float(parse_count(value, option))
    else:
        raise UsageError(f"--alert: unknown metric {metric!r} (choose from "
                         f"{', '.join(METRICS)})")
    return Rule(text.strip(), metric, op, threshold)


def format_value(metric: str, value: float) -> str:
    """A value as a person reads it: sizes in binary units, rates per second or minute."""
    if metric in SIZES:
        return format_bytes(value)
    if metric == "leak_rate":
        return f"{format_bytes(value * 60)}/min"
    if metric == "fragmentation":
        return f"{value:.3f}"
    if metric == "drops":
        return f"{value:.0f}"
    return f"{value:.4g}/s"


def measure(rule: Rule, snap: Snapshot) -> list[tuple[tuple[Any, ...], float, dict[str, Any]]]:
    """(subject key, value, who) for every subject the rule's metric is about."""
    if rule.metric in PROCESS_RATES or rule.metric == "live_bytes":
        attr = PROCESS_RATES.get(rule.metric, "held_bytes")
        return [(("pid", p.pid), float(getattr(p, attr)), {"pid": p.pid, "comm": p.comm})
                for p in snap.procs]
    if rule.metric == "drops":
        return [(("recording",), float(snap.drops_total), {})]
    if rule.metric == "orphaned":
        return [(("gpu", g), float(b), {"gpu_index": g}) for g, b in snap.orphaned.items()]
    out = []
    for g in snap.gpus:
        v = {"gpu_free": g.free_bytes, "gpu_largest_free": g.largest_free_bytes,
             "fragmentation": g.fragmentation}[rule.metric]
        if v is not None:
            out.append((("gpu", g.index), float(v), {"gpu_index": g.index}))
    return out


class Alerts:
    """Episode state of every rule; `evaluate` returns the alerts that begin now."""

    def __init__(self, rules: list[Rule], on_alert: str | None = None,
                 write: Callable[[pa.Table], None] | None = None,
                 err: Callable[[str], None] | None = None,
                 max_children: int = MAX_CHILDREN) -> None:
        self.rules = rules
        self.argv = parse_on_alert(on_alert) if on_alert is not None else None
        self.write = write
        self.err = err or (lambda s: print(s, file=sys.stderr, flush=True))
        self.max_children = max_children
        self.active: set[tuple[int, tuple[Any, ...]]] = set()
        self.fired: list[Fired] = []
        self.children: list[subprocess.Popen[bytes]] = []
        self.skipped = 0  # firings whose --on-alert did not run: max_children were running

    def evaluate(self, snap: Snapshot) -> list[Fired]:
        """Fire each condition that holds now and did not at the previous evaluation."""
        now: list[Fired] = []
        holding: set[tuple[int, tuple[Any, ...]]] = set()
        for i, rule in enumerate(self.rules):
            for key, value, who in measure(rule, snap):
                if not rule.holds(value):
                    continue
                holding.add((i, key))
                if (i, key) not in self.active:
                    now.append(Fired(snap.ts_ns, rule, value, **who))
        self.active = holding
        for f in now:
            self._fire(f)
        return now

    def _fire(self, f: Fired) -> None:
        self.fired.append(f)
        self.err(f.line())
        if self.write is not None:
            self.write(rows_table([f]))
        if self.argv is not None:
            self._reap()
            if len(self.children) >= self.max_children:
                self.skipped += 1
                if self.skipped == 1:
                    self.err(f"gputrace: warning: --on-alert: {len(self.children)} commands "
                             "still running: not run for this alert nor for any other "
                             "while they run (counted in the manifest, live.on_alert_skipped)")
                return
            try:
                self.children.append(subprocess.Popen(
                    self.argv, env={**os.environ, **f.env()}, stdin=subprocess.DEVNULL,
                    start_new_session=True))  # fmt: skip
            except OSError as e:
                self.err(f"gputrace: warning: --on-alert: cannot run {self.argv[0]}: "
                         f"{e.strerror}")

    def _reap(self) -> None:
        self.children = [c for c in self.children if c.poll() is None]

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Wait for the --on-alert commands still running, all of them together for at
        most `timeout_s`; then end the rest (each one's process group: SIGTERM, and
        SIGKILL a second later), so the recorder ends soon after its command."""
        deadline = time.monotonic() + timeout_s
        for c in self.children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.wait(timeout=max(deadline - time.monotonic(), 0.0))
        self._reap()
        if self.children:
            self.err(f"gputrace: warning: --on-alert: {len(self.children)} commands still "
                     f"running {timeout_s:g} s after the recording: ended")
            for sig, grace in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, KILL_GRACE_S)):
                for c in self.children:
                    # started with start_new_session: its pid is its process group, and
                    # it is not reaped yet, so the pid still names it
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(c.pid, sig)
                deadline = time.monotonic() + grace
                for c in self.children:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        c.wait(timeout=max(deadline - time.monotonic(), 0.0))
                self._reap()
                if not self.children:
                    break
        if self.skipped:
            self.err(f"gputrace: --on-alert: not run for {self.skipped} alerts (at most "
                     f"{self.max_children} run at once)")


def parse_on_alert(text: str) -> list[str]:
    """`--on-alert CMD` split as a shell would split it (it is run without one)."""
    try:
        argv = shlex.split(text)
    except ValueError as e:  # an unclosed quote, a trailing backslash
        raise UsageError(f"--on-alert: cannot split {text!r}: {str(e).lower()}") from None
    if not argv:
        raise UsageError("--on-alert needs a command")
    return argv


def rows_table(fired: list[Fired]) -> pa.Table:
    """Alerts as rows of the `alerts` table."""
    return pa.Table.from_pylist(
        [{"ts_ns": f.ts_ns, "alert": f.rule.metric, "expr": f.rule.text, "pid": f.pid,
          "comm": f.comm, "gpu_index": f.gpu_index, "value": f.value,
          "threshold": f.rule.threshold} for f in fired],
        schema=schema.ALERTS.arrow_schema,
    )
