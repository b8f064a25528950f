"""Watching a recording while it runs: running aggregates fed by the recorder
(aggregates), a terminal view (view), a Prometheus endpoint (metrics) and
alerts (alerts). `run` wraps `Recorder.run` with whichever of them is asked for;
with none asked for it is `Recorder.run` itself. docs/live.md.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa

from gputrace.errors import GputraceError, UsageError


class Watchable(Protocol):
    def run(self) -> int: ...


@dataclass
class LiveOptions:
    view: bool = False  # --live
    metrics: str | None = None  # --metrics [HOST:]PORT
    alerts: list[str] = field(default_factory=list)  # --alert EXPR (repeatable)
    on_alert: str | None = None  # --on-alert CMD

    @property
    def wanted(self) -> bool:
        return self.view or self.metrics is not None or bool(self.alerts)


def _stats_of(recorder: Any) -> Callable[[], dict[str, Any]] | None:
    """The recorder's stats() as the aggregates read it (rows, drops, decode_errors,
    cpu_seconds, rss_bytes), whatever container it comes in."""
    fn = getattr(recorder, "stats", None)
    if not callable(fn):
        return None

    def stats() -> dict[str, Any]:
        s = fn()
        d: dict[str, Any] = dict(s) if isinstance(s, dict) else dict(vars(s))
        aliases = {"rows": ("rows", "rows_per_table", "tables"),
                   "drops": ("drops",), "decode_errors": ("decode_errors",),
                   "cpu_seconds": ("cpu_seconds", "cpu_s", "cpu_time_s"),
                   "rss_bytes": ("rss_bytes", "rss", "max_rss_bytes")}
        out = {}
        for key, names in aliases.items():
            for n in names:
                if d.get(n) is not None:
                    out[key] = d[n]
                    break
        return out

    return stats


def run(recorder: Watchable, opts: LiveOptions) -> int:
    """Record as `recorder.run()` does, watched as `opts` asks; its exit status."""
    if not opts.wanted:
        if opts.on_alert is not None:
            raise UsageError("--on-alert needs at least one --alert")
        return recorder.run()
    from gputrace.live.aggregates import Aggregates
    from gputrace.live.alerts import Alerts, parse_alert, parse_on_alert
    from gputrace.live.metrics import MetricsServer, parse_addr

    # every option is read before anything listens or records
    rules = [parse_alert(t) for t in opts.alerts]
    if opts.on_alert is not None and not rules:
        raise UsageError("--on-alert needs at least one --alert")
    if opts.on_alert is not None:
        parse_on_alert(opts.on_alert)
    addr = parse_addr(opts.metrics) if opts.metrics is not None else None
    if opts.view and not sys.stdout.isatty():
        raise UsageError("--live needs a terminal (use --metrics to watch from elsewhere)")
    add_observer = getattr(recorder, "add_observer", None)
    if not callable(add_observer):
        raise GputraceError("this recorder cannot be watched live (no add_observer)")
    who = getattr(recorder, "identity_of", None)
    agg = Aggregates(stats=_stats_of(recorder), who=who if callable(who) else None)
    alerts = Alerts(rules, opts.on_alert, write=lambda t: _write_alerts(recorder, t))
    freezer = getattr(recorder, "freezer", None)

    def observe(name: str, table: pa.Table) -> None:
        # writer thread: the alerts table is appended on the thread that owns the writer
        if name == "alerts":
            return
        agg.observe(name, table)
        if rules:
            mark_layer(recorder, [r.text for r in rules])
            skipped = alerts.skipped
            for f in alerts.evaluate(agg.snapshot()):
                agg.note_alert(f.rule.metric)
                if freezer is not None:  # record --freeze-on alert
                    freezer.fire("alert", f.ts_ns, {"alert": f.rule.metric, "expr": f.rule.text,
                                                    "pid": f.pid, "comm": f.comm,
                                                    "gpu_index": f.gpu_index, "value": f.value})
            if alerts.skipped != skipped:
                note_skipped(recorder, [r.text for r in rules], alerts.skipped)

    add_observer(observe)
    server = MetricsServer(agg.snapshot, *addr) if addr is not None else None
    view = None
    try:
        if server is not None:
            print(f"gputrace: metrics on {server.url}", file=sys.stderr, flush=True)
        if opts.view:
            from gputrace.live.view import View

            view = View(agg.snapshot)
            view.start()
        return recorder.run()
    finally:
        if view is not None:
            view.close()
        if server is not None:
            server.close()
        alerts.close()


def _writer(recorder: Any) -> Any:
    """The recorder's trace writer (on the recorder, or on its session)."""
    w = getattr(recorder, "writer", None)
    return w if w is not None else getattr(getattr(recorder, "session", None), "writer", None)


def _write_alerts(recorder: Any, table: pa.Table) -> None:
    """Append alert rows to the trace (writer thread)."""
    writer = _writer(recorder)
    if writer is None:
        return
    writer.append("alerts", table)


def mark_layer(recorder: Any, rules: list[str]) -> None:
    """Name the `live` layer and the alert expressions in the manifest, so an empty
    alerts table reads as "none fired", not "not recorded"."""
    writer = _writer(recorder)
    if writer is None:
        return
    layers = list(writer.manifest.get("layers", []))
    if "live" not in layers:
        writer.update_manifest(layers=[*layers, "live"], live={"alerts": rules})


def note_skipped(recorder: Any, rules: list[str], skipped: int) -> None:
    """Count in the manifest (`live.on_alert_skipped`) the alerts whose --on-alert
    command did not run because as many as may run at once were still running."""
    writer = _writer(recorder)
    if writer is not None:
        writer.update_manifest(live={"alerts": rules, "on_alert_skipped": skipped})
