"""The Prometheus endpoint: served over HTTP on loopback, parsed back with
prometheus_client's own text parser, names per the conventions, the top-N
cardinality rule. Synthetic data (gputrace.builder)."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gputrace.builder import MiB, TraceBuilder
from gputrace.errors import UsageError
from gputrace.live.aggregates import Aggregates
from gputrace.live.metrics import MetricsServer, parse_addr
from tests.test_live_aggregates import Clock, feed


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


@pytest.mark.parametrize("text", ["", "x", "1:70000", "host:-1"])
def test_parse_addr_rejects(text: str) -> None:
    with pytest.raises(UsageError, match="--metrics"):
        parse_addr(text)


def test_busy_port_is_a_usage_error(agg: Aggregates) -> None:
    srv = MetricsServer(agg.snapshot, "127.0.0.1", 0)
    try:
        with pytest.raises(UsageError, match="cannot listen"):
            MetricsServer(agg.snapshot, "127.0.0.1", srv.port)
    finally:
        srv.close()
