"""What does a Prometheus server scraping the recorder see? The running
aggregates in the Prometheus text exposition format, served over HTTP by
prometheus_client (read-only: every request gets the current values).

Names follow the Prometheus conventions: `gputrace_` prefix, base units in the
name (bytes, seconds), `_total` on counters. Cardinality is bounded: per-process
series exist for the `top` processes with the most live bytes (20 by default);
all others are summed into one series with `pid="other", comm="other"` (that
series sums a changing set of processes, so it may go down). ioctl names come
from the decoder's fixed command table; GPUs and causes are small fixed sets.
docs/live.md lists every metric with its type and labels.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

from gputrace.errors import GputraceError, UsageError

try:
    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        Metric,
    )
except ImportError:
    # an extra, not a base dependency: the base install only analyzes
    raise GputraceError(
        "the live view and metrics need prometheus_client: pip install 'gputrace[record]'"
    ) from None
from gputrace.live.aggregates import LATENCY_BUCKETS_S
from gputrace.live.snapshot import ProcView, Snapshot

TOP_PROCESSES = 20
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9400
OTHER = "other"


def parse_addr(text: str) -> tuple[str, int]:
    """`9400`, `:9400`, `127.0.0.1:9400`, `[::1]:9400` or `0.0.0.0:9400` (all interfaces:
    asked for explicitly). A bare port binds to loopback."""
    t = text.strip()
    host, sep, port = t.rpartition(":")
    if not sep:
        host, port = "", t
    host = host.strip("[]") or DEFAULT_HOST
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UsageError(f"--metrics: cannot read {text!r} as [HOST:]PORT (port 0 to 65535)")
    return host, int(port)


def _gpu(g: int | None) -> str:
    return "" if g is None else str(g)


def bounded(procs: list[ProcView], top: int) -> tuple[list[ProcView], list[ProcView]]:
    """(the `top` processes with the most live bytes, the rest): ties by pid."""
    order = sorted(procs, key=lambda p: (-p.live_total, p.pid))
    return order[:top], order[top:]


class LiveCollector:
    """A prometheus_client collector reading a fresh snapshot on every scrape."""

    def __init__(self, snapshot: Callable[[], Snapshot], top: int = TOP_PROCESSES) -> None:
        self.snapshot = snapshot
        self.top = top

    def describe(self) -> list[Metric]:
        return []  # collected lazily: no scrape at registration

    def collect(self) -> Iterator[Metric]:
        s = self.snapshot()
        yield from self._processes(s)
        yield from self._driver(s)
        yield from self._recorder(s)

    def _processes(self, s: Snapshot) -> Iterator[Metric]:
        live = GaugeMetricFamily("gputrace_live_bytes",
                                 "Bytes allocated and not yet freed, per process, GPU and layer.",
                                 labels=["pid", "comm", "gpu", "layer"])  # fmt: skip
        allocs = CounterMetricFamily("gputrace_allocations",
                                     "Successful allocations per process and layer.",
                                     labels=["pid", "comm", "layer"])  # fmt: skip
        frees = CounterMetricFamily("gputrace_frees", "Frees of a live allocation per "
                                    "process and layer.", labels=["pid", "comm", "layer"])
        growth = GaugeMetricFamily("gputrace_growth_bytes_per_second",
                                   "Live bytes gained over the growth window, per second "
                                   "(the leak rate).", labels=["pid", "comm"])  # fmt: skip
        gfaults = CounterMetricFamily("gputrace_process_gpu_faults",
                                      "GPU faults per process.", labels=["pid", "comm"])
        cfaults = CounterMetricFamily("gputrace_process_cpu_faults",
                                      "CPU faults on managed memory per process.",
                                      labels=["pid", "comm"])  # fmt: skip
        shown, rest = bounded(s.procs, self.top)
        rows: list[tuple[str, str, ProcView]] = [(str(p.pid), p.comm, p) for p in shown]
        sums_live: dict[tuple[str, str], int] = defaultdict(int)
        sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for p in rest:
            for (layer, g), n in p.live.items():
                sums_live[(_gpu(g), layer)] += n
            for layer, n in p.allocations.items():
                sums["allocs"][layer] += n
            for layer, n in p.frees.items():
                sums["frees"][layer] += n
            sums["growth"][""] += p.growth_bytes_per_s
            sums["gfaults"][""] += p.gpu_faults
            sums["cfaults"][""] += p.cpu_faults
        for pid, comm, p in rows:
            for (layer, g), n in sorted(p.live.items(), key=lambda x: (x[0][0], _gpu(x[0][1]))):
                live.add_metric([pid, comm, _gpu(g), layer], n)
            for layer, n in sorted(p.allocations.items()):
                allocs.add_metric([pid, comm, layer], n)
            for layer, n in sorted(p.frees.items()):
                frees.add_metric([pid, comm, layer], n)
            growth.add_metric([pid, comm], p.growth_bytes_per_s)
            gfaults.add_metric([pid, comm], p.gpu_faults)
            cfaults.add_metric([pid, comm], p.cpu_faults)
        if rest:
            for (gs, lay), total in sorted(sums_live.items()):
                live.add_metric([OTHER, OTHER, gs, lay], total)
            for lay, x in sorted(sums["allocs"].items()):
                allocs.add_metric([OTHER, OTHER, lay], x)
            for lay, x in sorted(sums["frees"].items()):
                frees.add_metric([OTHER, OTHER, lay], x)
            growth.add_metric([OTHER, OTHER], sums["growth"][""])
            gfaults.add_metric([OTHER, OTHER], sums["gfaults"][""])
            cfaults.add_metric([OTHER, OTHER], sums["cfaults"][""])
        procs = GaugeMetricFamily("gputrace_processes",
                                  "Processes with live series: all, or only those beyond "
                                  "the top-N (shown=\"false\").", labels=["shown"])
        procs.add_metric(["true"], len(shown))
        procs.add_metric(["false"], len(rest))
        yield from (live, allocs, frees, growth, gfaults, cfaults, procs)

    def _driver(self, s: Snapshot) -> Iterator[Metric]:
        ioctls = CounterMetricFamily("gputrace_ioctls", "ioctls on NVIDIA device files by "
                                     "decoded command.", labels=["name"])
        lat = HistogramMetricFamily("gputrace_ioctl_latency_seconds",
                                    "ioctl time from syscall entry to exit.", labels=["name"])
        for name in sorted(s.ioctls):
            ioctls.add_metric([name], s.ioctls[name])
            counts, total = s.ioctl_latency.get(name, ([], 0.0))
            if counts:
                cum, buckets = 0, []
                for bound, n in zip([*map(str, LATENCY_BUCKETS_S), "+Inf"], counts,
                                    strict=True):  # fmt: skip
                    cum += n
                    buckets.append((bound, cum))
                lat.add_metric([name], buckets, total)
        gf = CounterMetricFamily("gputrace_gpu_faults", "GPU faults by GPU and source.",
                                 labels=["gpu", "source"])
        for (g, src), n in sorted(s.gpu_faults.items(), key=lambda x: (_gpu(x[0][0]), x[0][1])):
            gf.add_metric([_gpu(g), src], n)
        fb = CounterMetricFamily("gputrace_gpu_fault_batches", "GPU fault batches by GPU.",
                                 labels=["gpu"])
        for g, n in sorted(s.fault_batches.items(), key=lambda x: _gpu(x[0])):
            fb.add_metric([_gpu(g)], n)
        mig = CounterMetricFamily("gputrace_migrations", "Page migrations by cause.",
                                  labels=["cause"])
        mb = CounterMetricFamily("gputrace_migrated_bytes", "Bytes migrated by cause.",
                                 labels=["cause"])
        for cause, (n, b) in sorted(s.migrations.items()):
            mig.add_metric([cause], n)
            mb.add_metric([cause], b)
        cf = CounterMetricFamily("gputrace_cpu_faults", "CPU faults on managed memory.")
        cf.add_metric([], s.cpu_faults)
        free = GaugeMetricFamily("gputrace_gpu_free_bytes", "Free GPU memory (RM heap free).",
                                 labels=["gpu"])
        largest = GaugeMetricFamily("gputrace_gpu_largest_free_bytes",
                                    "Largest free region: the largest allocation that can "
                                    "still succeed.", labels=["gpu"])  # fmt: skip
        heap = GaugeMetricFamily("gputrace_gpu_heap_bytes", "RM heap size.", labels=["gpu"])
        for gv in s.gpus:
            for fam, v in ((free, gv.free_bytes), (largest, gv.largest_free_bytes),
                           (heap, gv.heap_bytes)):  # fmt: skip
                if v is not None:
                    fam.add_metric([str(gv.index)], v)
        yield from (ioctls, lat, gf, fb, mig, mb, cf, free, largest, heap)

    def _recorder(self, s: Snapshot) -> Iterator[Metric]:
        rec = CounterMetricFamily("gputrace_events_recorded", "Rows appended to the trace "
                                  "per table.", labels=["table"])
        for t, n in sorted(s.rows.items()):
            rec.add_metric([t], n)
        drop = CounterMetricFamily("gputrace_events_dropped", "Events lost per ring buffer "
                                   "or queue.", labels=["buffer"])
        for b, n in sorted(s.drops.items()):
            drop.add_metric([b], n)
        bad = CounterMetricFamily("gputrace_decode_errors", "Records the decoder could not "
                                  "read, per buffer.", labels=["buffer"])
        for b, n in sorted(s.decode_errors.items()):
            bad.add_metric([b], n)
        cpu = CounterMetricFamily("gputrace_recorder_cpu_seconds", "CPU time of the recorder.")
        cpu.add_metric([], s.cpu_seconds)
        rss = GaugeMetricFamily("gputrace_recorder_resident_memory_bytes",
                                "Resident memory of the recorder.")
        rss.add_metric([], s.rss_bytes)
        alerts = CounterMetricFamily("gputrace_alerts", "Alerts fired (episodes begun) per "
                                     "alert metric.", labels=["alert"])
        for a, n in sorted(s.alerts.items()):
            alerts.add_metric([a], n)
        yield from (rec, drop, bad, cpu, rss, alerts)


class MetricsServer:
    """The exposition endpoint: `http://HOST:PORT/metrics` (any path answers the same)."""

    def __init__(self, snapshot: Callable[[], Snapshot], host: str, port: int,
                 top: int = TOP_PROCESSES) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(LiveCollector(snapshot, top))
        try:
            self.server, self.thread = start_http_server(port, host, self.registry)
        except OSError as e:
            raise UsageError(f"--metrics {host}:{port}: cannot listen: {e.strerror}") from None
        self.host = host
        self.port = int(self.server.server_port)

    @property
    def url(self) -> str:
        h = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{h}:{self.port}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        t: Any = self.thread
        if isinstance(t, threading.Thread):
            t.join(timeout=5)
