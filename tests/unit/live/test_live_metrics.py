"""The Prometheus endpoint: served over HTTP on loopback, parsed back with
prometheus_client's own text parser, names per the conventions, the top-N
cardinality rule. Synthetic data (gputrace.trace.builder)."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gputrace.errors import UsageError
from gputrace.live.aggregates import Aggregates
from gputrace.live.metrics import MAX_CONNECTIONS, MetricsServer, parse_addr
from gputrace.trace.builder import MiB, TraceBuilder
from tests.unit.live.test_live_aggregates import Clock, feed


def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Samples by name, via the client library's parser (which rejects bad text)."""
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def one(samples: dict[str, list[tuple[dict[str, str], float]]], metric: str,
        **labels: str) -> float:
    got = [v for lab, v in samples.get(metric, []) if all(lab.get(k) == x
                                                          for k, x in labels.items())]
    assert len(got) == 1, (metric, labels, samples.get(metric))
    return got[0]


@pytest.fixture
def agg() -> Aggregates:
    b = TraceBuilder()  # synthetic
    for pid in range(1, 6):
        b.process(pid, f"p{pid}")
        for _ in range(pid):
            b.cuda_alloc(0.1, pid, MiB)
    b.rm_alloc(0.1, 1, size=2 * MiB)
    b.gpu_memory(0.1, 0, heap=80 << 30, free=8 << 30, largest=2 << 30)
    b.gpu_fault(0.1, 0, 0x1000, pid=1)
    b.migration(0.1, -1, 0, 0x1000, 2 * MiB, cause=1, pid=1)
    a = Aggregates(clock=Clock(), stats=lambda: {"drops": {"ioctl_events": 0}})
    feed(a, b)
    return a


def test_scrape_parses_and_holds_the_values(agg: Aggregates) -> None:
    srv = MetricsServer(agg.snapshot, "127.0.0.1", 0)
    try:
        assert srv.port > 0 and srv.url.startswith("http://127.0.0.1:")
        s = scrape(srv.url)
    finally:
        srv.close()
    assert one(s, "gputrace_live_bytes", pid="5", comm="p5", layer="api") == 5 * MiB
    assert one(s, "gputrace_live_bytes", pid="1", layer="rm", gpu="") == 2 * MiB
    assert one(s, "gputrace_allocations_total", pid="3", layer="api") == 3
    assert one(s, "gputrace_gpu_free_bytes", gpu="0") == 8 << 30
    assert one(s, "gputrace_gpu_largest_free_bytes", gpu="0") == 2 << 30
    assert one(s, "gputrace_gpu_faults_total", gpu="0", source="gpu_replayable") == 1
    assert one(s, "gputrace_migrations_total", cause="replayable_fault") == 1
    assert one(s, "gputrace_migrated_bytes_total", cause="replayable_fault") == 2 * MiB
    assert one(s, "gputrace_events_dropped_total", buffer="ioctl_events") == 0
    assert one(s, "gputrace_ioctl_latency_seconds_count", name="RM_ALLOC") == 1
    assert one(s, "gputrace_ioctl_latency_seconds_bucket", name="RM_ALLOC", le="+Inf") == 1
    assert one(s, "gputrace_recorder_cpu_seconds_total") > 0
    # conventions: counters end in _total, units in names
    for name in s:
        assert name.startswith("gputrace_")
        assert not name.endswith("_ms") and "milliseconds" not in name


def test_top_n_rest_summed_into_other(agg: Aggregates) -> None:
    srv = MetricsServer(agg.snapshot, "127.0.0.1", 0, top=2)
    try:
        s = scrape(srv.url)
    finally:
        srv.close()
    pids = {lab["pid"] for lab, _ in s["gputrace_live_bytes"]}
    assert pids == {"5", "4", "other"}  # most live bytes first; pid 1 has 1+2 MiB < 4
    assert one(s, "gputrace_live_bytes", pid="other", layer="api") == (1 + 2 + 3) * MiB
    assert one(s, "gputrace_live_bytes", pid="other", layer="rm") == 2 * MiB
    assert one(s, "gputrace_allocations_total", pid="other", layer="api") == 6
    assert one(s, "gputrace_processes", shown="false") == 3


@pytest.mark.parametrize(("text", "want"), [
    ("9400", ("127.0.0.1", 9400)), (":0", ("127.0.0.1", 0)),
    ("0.0.0.0:9100", ("0.0.0.0", 9100)), ("[::1]:9400", ("::1", 9400)),
])  # fmt: skip
def test_parse_addr_defaults_to_loopback(text: str, want: tuple[str, int]) -> None:
    assert parse_addr(text) == want


@pytest.mark.parametrize("text", ["", "x", "1:70000", "host:-1", "\u00b2", ":\u00b2",
                                  "\u0661\u0662", "9\uff14\uff10\uff10", "0" * 5000])
def test_parse_addr_rejects(text: str) -> None:
    """Only ASCII digits make a port: int() reads "²" as an error (it was a traceback)
    and Arabic-Indic or full-width digits as a number (it was port 12)."""
    with pytest.raises(UsageError, match="--metrics"):
        parse_addr(text)


def _closed(c: socket.socket) -> bool:
    """Has the server closed this connection (EOF or reset waiting to be read)?"""
    c.setblocking(False)
    try:
        return c.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except ConnectionError:
        return True
    finally:
        c.setblocking(True)


def _until(cond: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_half_sent_requests_hold_no_threads_and_time_out(agg: Aggregates) -> None:
    """Guards the recorder against a local user holding many half-sent requests (the
    blank line that ends a request never comes): one thread each grew the recorder
    to 402 threads and cost a storm 51 k events. Now no connection gets a thread,
    at most MAX_CONNECTIONS stay open (the oldest half-sent ones are closed to make
    room), a normal scrape still answers, and the rest close when their time is up."""
    srv = MetricsServer(agg.snapshot, "127.0.0.1", 0, timeout_s=2.0)
    held: list[socket.socket] = []
    try:
        threads = threading.active_count()
        for _ in range(200):
            c = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
            c.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never finished
            held.append(c)
        s = scrape(srv.url)
        assert one(s, "gputrace_live_bytes", pid="5", comm="p5", layer="api") == 5 * MiB
        assert threading.active_count() == threads
        assert _until(lambda: sum(not _closed(c) for c in held) <= MAX_CONNECTIONS, 1.5)
        assert _until(lambda: all(_closed(c) for c in held), 5.0)  # timed out
        assert one(scrape(srv.url), "gputrace_allocations_total", pid="3", layer="api") == 3
    finally:
        for c in held:
            c.close()
        srv.close()


def test_trickled_request_is_closed_at_its_deadline(agg: Aggregates) -> None:
    """Guards against a request sent a byte at a time: the time limit is the whole
    connection's, not each read's, so trickling cannot hold a connection open."""
    srv = MetricsServer(agg.snapshot, "127.0.0.1", 0, timeout_s=1.0)
    c = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    t0 = time.monotonic()
    try:
        with pytest.raises(OSError):  # the send that finds it closed
            while time.monotonic() - t0 < 6:
                c.sendall(b"X")
                time.sleep(0.05)
        assert time.monotonic() - t0 < 4
    finally:
        c.close()
        srv.close()


def test_scrapes_in_a_loop_render_once_per_interval(agg: Aggregates) -> None:
    """Guards the recorder's share of the CPU: requests closer together than the
    render interval get the same bytes, so a client scraping in a loop costs one
    snapshot per interval, not one per request."""
    calls = []

    def snapshot():  # type: ignore[no-untyped-def]
        calls.append(1)
        return agg.snapshot()

    srv = MetricsServer(snapshot, "127.0.0.1", 0, min_interval_s=60)
    try:
        for _ in range(30):
            scrape(srv.url)
    finally:
        srv.close()
    assert len(calls) == 1


def test_bad_requests_get_an_http_error(agg: Aggregates) -> None:
    """Anything but GET/HEAD is refused, and a request head past the size limit
    is answered and closed instead of buffered without end."""
    srv = MetricsServer(agg.snapshot, "127.0.0.1", 0)
    try:
        req = urllib.request.Request(srv.url, data=b"x", method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 405
        req = urllib.request.Request(srv.url, headers={"X-Big": "a" * 20000})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 431
        head = urllib.request.Request(srv.url, method="HEAD")
        with urllib.request.urlopen(head, timeout=10) as r:
            assert int(r.headers["Content-Length"]) > 0 and r.read() == b""
    finally:
        srv.close()


def test_busy_port_is_a_usage_error(agg: Aggregates) -> None:
    srv = MetricsServer(agg.snapshot, "127.0.0.1", 0)
    try:
        with pytest.raises(UsageError, match="cannot listen"):
            MetricsServer(agg.snapshot, "127.0.0.1", srv.port)
    finally:
        srv.close()


def test_oom_total_by_gpu_and_verdict() -> None:
    """Each allocation refused for want of memory counts once, with the verdict of the
    latest sample of its GPU (8 GiB free, 2 GiB the largest free region)."""
    b = TraceBuilder()  # synthetic
    b.process(7, "train")
    b.gpu_memory(0.1, 0, heap=80 << 30, free=8 << 30, largest=2 << 30)
    b.cuda_alloc(0.2, 7, 16 << 30, result=2)  # more than free: capacity
    b.cuda_alloc(0.3, 7, 4 << 30, result=2)  # free, but no region that big: fragmentation
    b.cuda_alloc(0.4, 7, 1 << 30, result=2)  # fits the largest region: limit
    b.cuda_alloc(0.5, 7, 32 << 30, result=1)  # not an OOM (CUDA_ERROR_INVALID_VALUE)
    b.rm_alloc(0.6, 7, size=12 << 30, status=0x51)  # RM NV_ERR_NO_MEMORY: capacity
    b.rm_alloc(0.7, 7, size=12 << 30)  # succeeded
    a = Aggregates(clock=Clock(), stats=lambda: {})
    feed(a, b, "processes", "gpu_memory", "cuda_calls", "ioctls")
    srv = MetricsServer(a.snapshot, "127.0.0.1", 0)
    try:
        s = scrape(srv.url)
    finally:
        srv.close()
    assert one(s, "gputrace_oom_total", gpu="0", verdict="capacity") == 2
    assert one(s, "gputrace_oom_total", gpu="0", verdict="fragmentation") == 1
    assert one(s, "gputrace_oom_total", gpu="0", verdict="limit") == 1
    assert len(s["gputrace_oom_total"]) == 3


def test_series_carry_namespace_pod_and_container() -> None:
    """Each process's series say its pod and container (names, else uid and id); the
    processes beyond the top N are one series, "other" in every label."""
    from gputrace.identity import Identity

    b = TraceBuilder()  # synthetic
    for pid in range(1, 4):
        b.process(pid, f"p{pid}")
        b.cuda_alloc(0.1, pid, pid * MiB)
    who = {3: Identity("c" * 64, "containerd", "u-3", "burstable", "ml", "trainer-0", "cuda"),
           2: Identity("d" * 64, "docker")}
    asked: list[int] = []

    def lookup(pid: int) -> Identity | None:
        asked.append(pid)
        return who.get(pid)

    a = Aggregates(clock=Clock(), who=lookup)
    feed(a, b)
    srv = MetricsServer(a.snapshot, "127.0.0.1", 0, top=2)
    try:
        s = scrape(srv.url)
    finally:
        srv.close()
    assert one(s, "gputrace_live_bytes", pid="3", namespace="ml", pod="trainer-0",
               container="cuda", layer="api") == 3 * MiB
    assert one(s, "gputrace_live_bytes", pid="2", namespace="", pod="", container="d" * 64,
               layer="api") == 2 * MiB
    assert one(s, "gputrace_live_bytes", pid="other", namespace="other", pod="other",
               container="other", layer="api") == 1 * MiB
    assert sorted(asked) == [1, 2, 3]  # once per process
