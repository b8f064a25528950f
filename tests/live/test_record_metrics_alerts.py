"""`record --metrics --alert` live on the stand-in driver and libcuda (root, bcc,
FUSE): the endpoint is scraped over HTTP while the workload holds its planted
leak, and its values equal the workload's known truth (expected.json); the
leak alert fires exactly once, for the workload's pid, and the trace's alerts
table holds it. Waits on the recorder's ready line and the workload's DONE line,
then polls the endpoint for the rows to arrive (no sleeps)."""

from __future__ import annotations

import re
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gputrace.analyses.helpers.lifetimes import API_ALLOCS
from gputrace.live.live_bytes import _base
from gputrace.record.recorder import Recorder
from gputrace.trace.reader import open_trace
from tests.record_helpers import RecorderProc, live_skip_reason, record_cmd, standin_driver_args

pytestmark = [pytest.mark.live]
_SKIP = live_skip_reason()
if _SKIP is None and not hasattr(Recorder, "add_observer"):
    _SKIP = "the recorder has no add_observer yet"
if _SKIP is not None:
    pytestmark.append(pytest.mark.skip(reason=_SKIP))

Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(url: str) -> Samples:
    """One scrape, read by prometheus_client's own parser (it rejects malformed text)."""
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def total(s: Samples, metric: str, **labels: str) -> float:
    return sum(v for lab, v in s.get(metric, [])
               if all(lab.get(k) == x for k, x in labels.items()))


def truth() -> dict[str, Any]:
    """What the default workload leaves: from tests/standin_cuda/expected.json."""
    from tests.standin_cuda.standin_cuda import load_expected_json

    exp = load_expected_json()
    api_allocs = sum(1 for a in exp["allocations"]
                     if a["result"] == 0 and _base(a["symbol"]) in API_ALLOCS)
    drv = exp["driver"]
    return {
        "api_allocs": api_allocs, "api_frees": api_allocs - exp["leaks"]["count"],
        "api_live": exp["leaks"]["bytes"],
        "rm_allocs": (drv["rm_alloc_by_class"]["0x40"]
                      + drv["rm_alloc_memory_os_descriptor"]["count"]),
        "rm_live": drv["leaked_vidmem_bytes"],
    }  # fmt: skip


def wait_for(url: str, cond: Any, timeout: float = 30.0) -> Samples:
    """Scrape until cond(samples) holds: rows reach the aggregates a rotation later."""
    deadline = time.monotonic() + timeout
    while True:
        s = scrape(url)
        if cond(s) or time.monotonic() > deadline:
            return s
        time.sleep(0.1)


def test_metrics_and_leak_alert_live(tmp_path: Path) -> None:
    from tests.standin.standin import mounted_driver
    from tests.standin_cuda.standin_cuda import waiting_workload

    want = truth()
    assert want == {"api_allocs": 42, "api_frees": 19, "api_live": 23 << 20,
                    "rm_allocs": 22, "rm_live": 24 << 20}  # fmt: skip
    out = tmp_path / "trace"
    with mounted_driver(tmp_path, budget=256 << 20) as dev, \
            waiting_workload("--hold", devdir=dev) as w:
        rec = RecorderProc(record_cmd(
            out, "-p", str(w.pid), "--device-dir", str(dev), *standin_driver_args(),
            "--metrics", "127.0.0.1:0", "--alert", "leak_rate>1MiB/min"))  # fmt: skip
        rec.wait_ready()
        line = next(x for x in rec.stderr if x.startswith("gputrace: metrics on "))
        url = line.split()[-1]
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/metrics", url)
        during = scrape(url)  # before the workload ran: valid, and nothing live yet
        assert total(during, "gputrace_live_bytes", pid=str(w.pid)) == 0
        assert total(during, "gputrace_alerts_total") == 0
        assert w.proc.stdin is not None and w.proc.stdout is not None
        w.proc.stdin.write("go\n")
        w.proc.stdin.flush()
        assert any(x.strip() == "DONE" for x in w.proc.stdout)  # its leak is now held
        pid = str(w.pid)

        def arrived(s: Samples) -> bool:
            api = total(s, "gputrace_allocations_total", pid=pid, layer="api")
            rm = total(s, "gputrace_allocations_total", pid=pid, layer="rm")
            return bool(api >= want["api_allocs"] and rm >= want["rm_allocs"])

        end = wait_for(url, arrived)
        w.proc.stdin.close()  # let it exit: the recording ends with its target
        w.proc.wait(timeout=30)
    assert rec.wait() == 0, "".join(rec.stderr)
    # the end-of-run scrape equals the workload's truth
    assert total(end, "gputrace_allocations_total", pid=pid, layer="api") == want["api_allocs"]
    assert total(end, "gputrace_frees_total", pid=pid, layer="api") == want["api_frees"]
    assert total(end, "gputrace_live_bytes", pid=pid, layer="api") == want["api_live"]
    assert total(end, "gputrace_allocations_total", pid=pid, layer="rm") == want["rm_allocs"]
    assert total(end, "gputrace_live_bytes", pid=pid, layer="rm") == want["rm_live"]
    assert {lab["comm"] for lab, _ in end["gputrace_live_bytes"]} == {"cuda_workload"}
    assert total(end, "gputrace_events_dropped_total") == 0
    assert total(end, "gputrace_decode_errors_total") == 0
    assert total(end, "gputrace_ioctls_total", name="RM_ALLOC") >= want["rm_allocs"]
    assert total(end, "gputrace_growth_bytes_per_second", pid=pid) > 0
    assert total(end, "gputrace_alerts_total", alert="leak_rate") == 1
    # the alert: exactly once, about the workload, one stderr line, one row
    alerts = [x for x in rec.stderr if x.startswith("gputrace: alert: ")]
    assert len(alerts) == 1, alerts
    assert f"pid {pid} (cuda_workload)" in alerts[0]
    t = open_trace(out)
    assert t.status == "complete" and "live" in t.layers
    assert t.manifest["live"] == {"alerts": ["leak_rate>1MiB/min"]}
    rows = t.scan("alerts").collect().to_dicts()
    assert len(rows) == 1
    assert rows[0]["pid"] == w.pid and rows[0]["alert"] == "leak_rate"
    assert rows[0]["expr"] == "leak_rate>1MiB/min"
    assert rows[0]["value"] > rows[0]["threshold"] == pytest.approx((1 << 20) / 60)
