"""What does a Prometheus server scraping the recorder see? The running
aggregates in the Prometheus text exposition format, rendered by prometheus_client
and served over HTTP by one thread of ours with bounded connections and timeouts
(read-only: every request gets values at most MIN_RENDER_INTERVAL_S old).

Names follow the Prometheus conventions: `gputrace_` prefix, base units in the
name (bytes, seconds), `_total` on counters. Cardinality is bounded: per-process
series exist for the `top` processes with the most live bytes (20 by default);
all others are summed into one series with `pid="other", comm="other"` (and
namespace, pod and container "other"; that series sums a changing set of processes, so
it may go down). Each process's series carry its Kubernetes namespace, pod and
container, read once per process: no more series than processes shown. ioctl names come
from the decoder's fixed command table; GPUs and causes are small fixed sets.
docs/live.md lists every metric with its type and labels.
"""

from __future__ import annotations

import contextlib
import math
import re
import selectors
import socket
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from gputrace.errors import GputraceError, UsageError

try:
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
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
from gputrace.render.safe import printable

TOP_PROCESSES = 20
WHO = ["pid", "comm", "namespace", "pod", "container"]
"""The labels of every per-process series: the process, and its Kubernetes namespace,
pod and container (gputrace.identity `Identity.labels`; empty outside a pod or container)."""
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9400
OTHER = "other"
MAX_CONNECTIONS = 16
"""Open connections at most: a scraper needs one, and each costs the recorder a
file descriptor."""
REQUEST_TIMEOUT_S = 5.0
"""A connection's whole time to send its request and read the answer."""
MAX_REQUEST_BYTES = 8192
MIN_RENDER_INTERVAL_S = 0.5
"""Requests closer together than this get the same rendered exposition."""
LISTEN_BACKLOG = 64
_PORT = re.compile(r"[0-9]{1,5}")


def parse_addr(text: str) -> tuple[str, int]:
    """`9400`, `:9400`, `127.0.0.1:9400`, `[::1]:9400` or `0.0.0.0:9400` (all interfaces:
    asked for explicitly). A bare port binds to loopback."""
    t = text.strip()
    host, sep, port = t.rpartition(":")
    if not sep:
        host, port = "", t
    host = host.strip("[]") or DEFAULT_HOST
    # ASCII digits only: int() would also read "²" (an error) or "١٢" (as 12)
    if not _PORT.fullmatch(port) or not 0 <= int(port) <= 65535:
        raise UsageError(f"--metrics: cannot read {text!r} as [HOST:]PORT (port 0 to 65535)")
    return host, int(port)


def _gpu(g: int | None) -> str:
    return "" if g is None else str(g)


def bounded(procs: list[ProcView], top: int) -> tuple[list[ProcView], list[ProcView]]:
    """(the `top` processes holding the most, the rest): ties by pid."""
    order = sorted(procs, key=lambda p: (-p.held_bytes, p.pid))
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
                                 labels=[*WHO, "gpu", "layer"])  # fmt: skip
        allocs = CounterMetricFamily("gputrace_allocations",
                                     "Successful allocations per process and layer.",
                                     labels=[*WHO, "layer"])  # fmt: skip
        frees = CounterMetricFamily("gputrace_frees", "Frees of a live allocation per "
                                    "process and layer.", labels=[*WHO, "layer"])
        growth = GaugeMetricFamily("gputrace_growth_bytes_per_second",
                                   "Live bytes gained over the growth window, per second "
                                   "(the leak rate).", labels=WHO)  # fmt: skip
        gfaults = CounterMetricFamily("gputrace_process_gpu_faults",
                                      "GPU faults per process.", labels=WHO)
        cfaults = CounterMetricFamily("gputrace_process_cpu_faults",
                                      "CPU faults on managed memory per process.",
                                      labels=WHO)  # fmt: skip
        shown, rest = bounded(s.procs, self.top)
        rows = [([str(p.pid), p.comm, *p.who], p) for p in shown]
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
        for who, p in rows:
            for (layer, g), n in sorted(p.live.items(), key=lambda x: (x[0][0], _gpu(x[0][1]))):
                live.add_metric([*who, _gpu(g), layer], n)
            for layer, n in sorted(p.allocations.items()):
                allocs.add_metric([*who, layer], n)
            for layer, n in sorted(p.frees.items()):
                frees.add_metric([*who, layer], n)
            growth.add_metric(who, p.growth_bytes_per_s)
            gfaults.add_metric(who, p.gpu_faults)
            cfaults.add_metric(who, p.cpu_faults)
        if rest:
            others = [OTHER] * len(WHO)
            for (gs, lay), total in sorted(sums_live.items()):
                live.add_metric([*others, gs, lay], total)
            for lay, x in sorted(sums["allocs"].items()):
                allocs.add_metric([*others, lay], x)
            for lay, x in sorted(sums["frees"].items()):
                frees.add_metric([*others, lay], x)
            growth.add_metric(others, sums["growth"][""])
            gfaults.add_metric(others, sums["gfaults"][""])
            cfaults.add_metric(others, sums["cfaults"][""])
        held = GaugeMetricFamily(
            "gputrace_held_bytes", "GPU memory a process holds, one figure: each piece of "
            "memory once, whatever layers saw it (gputrace_live_bytes is the per-layer "
            "breakdown, never to be added across layers).", labels=WHO)
        for who, p in rows:
            held.add_metric(who, p.held_bytes)
        if rest:
            held.add_metric([OTHER] * len(WHO), sum(p.held_bytes for p in rest))
        orphaned = GaugeMetricFamily(
            "gputrace_orphaned_bytes", "Video memory the driver's per-process accounting "
            "charges to pids with no live traced process (exited with a child holding "
            "their descriptors, zombies, other PID namespaces), per GPU.", labels=["gpu"])
        for g, b in sorted(s.orphaned.items()):
            orphaned.add_metric([str(g)], b)
        procs = GaugeMetricFamily("gputrace_processes",
                                  "Processes with live series: all, or only those beyond "
                                  "the top-N (shown=\"false\").", labels=["shown"])
        procs.add_metric(["true"], len(shown))
        procs.add_metric(["false"], len(rest))
        yield from (live, held, orphaned, allocs, frees, growth, gfaults, cfaults, procs)

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
        oom = CounterMetricFamily("gputrace_oom", "Allocations refused for want of GPU "
                                  "memory, per GPU and verdict of the latest GPU memory "
                                  "sample (capacity, fragmentation, unknown).",
                                  labels=["gpu", "verdict"])  # fmt: skip
        for (g, v), n in sorted(s.ooms.items(), key=lambda kv: (_gpu(kv[0][0]), kv[0][1])):
            oom.add_metric([_gpu(g), v], n)
        yield from (rec, drop, bad, cpu, rss, alerts, oom)


class MetricsServer:
    """The exposition endpoint: `http://HOST:PORT/metrics` (any path answers the same).

    One thread serves every connection through a selector, so a client cannot make
    the recorder grow threads: at most `max_connections` are open at once (past that
    the oldest not being answered is closed, or the new one when all are being
    answered), each has `timeout_s` in all to send its request and read the answer,
    and a request is at most MAX_REQUEST_BYTES. The exposition is rendered at most
    once per `min_interval_s` and the same bytes answer every request in between, so
    scraping in a loop costs the recorder one render per interval, not one per request.
    """

    def __init__(self, snapshot: Callable[[], Snapshot], host: str, port: int,
                 top: int = TOP_PROCESSES, *, max_connections: int = MAX_CONNECTIONS,
                 timeout_s: float = REQUEST_TIMEOUT_S,
                 min_interval_s: float = MIN_RENDER_INTERVAL_S) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(LiveCollector(snapshot, top))
        self.max_connections = max_connections
        self.timeout_s = timeout_s
        self.min_interval_s = min_interval_s
        try:
            family, kind, proto, _, sockaddr = socket.getaddrinfo(
                host, port, 0, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)[0]
            self.listener = socket.socket(family, kind, proto)
        except OSError as e:
            raise UsageError(f"--metrics {host}:{port}: cannot listen: {_why(e)}") from None
        try:
            self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.listener.bind(sockaddr)
            self.listener.listen(LISTEN_BACKLOG)
            self.listener.setblocking(False)
        except OSError as e:
            self.listener.close()
            raise UsageError(f"--metrics {host}:{port}: cannot listen: {_why(e)}") from None
        self.host = host
        self.port = int(self.listener.getsockname()[1])
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._conns: dict[socket.socket, _Conn] = {}
        self._body = b""
        self._rendered_at = -math.inf
        self._warned = False
        self.thread = threading.Thread(target=self._serve, name="gputrace-metrics",
                                       daemon=True)  # fmt: skip
        self.thread.start()

    @property
    def url(self) -> str:
        h = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{h}:{self.port}/metrics"

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self.thread.join(timeout=5)
        self.listener.close()
        self._wake_r.close()
        self._wake_w.close()

    # ------------------------------------------------------------ the server thread
    def _serve(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self.listener, selectors.EVENT_READ)
        sel.register(self._wake_r, selectors.EVENT_READ)
        try:
            while True:
                now = time.monotonic()
                for sock in [s for s, c in self._conns.items() if c.deadline <= now]:
                    self._drop(sel, sock)  # too slow: a half-sent request holds nothing
                wait = min((c.deadline for c in self._conns.values()), default=now + 60)
                for key, _mask in sel.select(max(wait - now, 0.0)):
                    obj = key.fileobj
                    if obj is self._wake_r:
                        return
                    if obj is self.listener:
                        self._accept(sel)
                    elif isinstance(obj, socket.socket) and obj in self._conns:
                        self._step(sel, obj)
        finally:
            for sock in list(self._conns):
                self._drop(sel, sock)
            sel.close()

    def _accept(self, sel: selectors.BaseSelector) -> None:
        for _ in range(LISTEN_BACKLOG):  # what is queued now, not what keeps arriving
            try:
                sock, _addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # e.g. EMFILE: the next select tries again
            sock.setblocking(False)
            if len(self._conns) >= self.max_connections:
                reading = [s for s, c in self._conns.items() if not c.out]
                if not reading:
                    sock.close()  # every slot is being answered: this one waits its turn
                    continue
                self._drop(sel, min(reading, key=lambda s: self._conns[s].deadline))
            self._conns[sock] = _Conn(time.monotonic() + self.timeout_s)
            sel.register(sock, selectors.EVENT_READ)

    def _step(self, sel: selectors.BaseSelector, sock: socket.socket) -> None:
        c = self._conns[sock]
        try:
            if c.out:
                sent = sock.send(c.out)
                c.out = c.out[sent:]
                if not c.out:
                    # Read what the client still sends until it closes: closing with
                    # unread bytes would reset the connection, and the client could
                    # lose the answer (a 405 to a POST with a body, a 431).
                    sock.shutdown(socket.SHUT_WR)
                    c.done = True
                    sel.modify(sock, selectors.EVENT_READ)
                return
            data = sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(sel, sock)
            return
        if not data:
            self._drop(sel, sock)
            return
        if c.done:
            return
        c.inbuf += data
        end = c.inbuf.find(b"\r\n\r\n")
        if end < 0 and len(c.inbuf) < MAX_REQUEST_BYTES:
            return
        c.out = memoryview(self._answer(bytes(c.inbuf[:end]) if end >= 0 else None))
        sel.modify(sock, selectors.EVENT_WRITE)

    def _drop(self, sel: selectors.BaseSelector, sock: socket.socket) -> None:
        self._conns.pop(sock, None)
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(sock)
        sock.close()

    def _answer(self, head: bytes | None) -> bytes:
        """The whole HTTP/1.1 response to a request head (None: too large)."""
        if head is None:
            return _response("431 Request Header Fields Too Large", b"request too large\n")
        method = head.split(b" ", 1)[0]
        if method not in (b"GET", b"HEAD"):
            return _response("405 Method Not Allowed", b"GET or HEAD\n", b"Allow: GET, HEAD\r\n")
        body = self._render()
        if body is None:
            return _response("500 Internal Server Error", b"metrics unavailable\n")
        return _response("200 OK", body, content_type=CONTENT_TYPE_LATEST,
                         head_only=method == b"HEAD")

    def _render(self) -> bytes | None:
        now = time.monotonic()
        if now - self._rendered_at >= self.min_interval_s:
            try:
                self._body = generate_latest(self.registry)
            except Exception as e:  # a bug here must not end the endpoint for good
                if not self._warned:
                    self._warned = True
                    print(f"gputrace: warning: --metrics: cannot render: "
                          f"{type(e).__name__}: {printable(str(e))}", file=sys.stderr,
                          flush=True)  # fmt: skip
                return None
            self._rendered_at = now
        return self._body


@dataclass
class _Conn:
    deadline: float  # monotonic: closed then, whatever it is doing
    inbuf: bytearray = field(default_factory=bytearray)
    out: memoryview | bytes = b""  # the response left to send (empty: not sending)
    done: bool = False  # answered: what it sends now is read and dropped


def _why(e: OSError) -> str:
    return e.strerror or str(e)


def _response(status: str, body: bytes, extra: bytes = b"", *,
              content_type: str = "text/plain; charset=utf-8",
              head_only: bool = False) -> bytes:
    head = (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n").encode() + extra
    return head + b"\r\n" + (b"" if head_only else body)
