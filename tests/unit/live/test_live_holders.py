"""Who holds what, live: one figure per process (its largest layer, the layers never
added), and the memory the driver charges to pids no live traced process has
(`gputrace_orphaned_bytes`, `--alert orphaned>...`). Synthetic tables
(gputrace.trace.builder), truth written beside each scenario."""

from __future__ import annotations

from gputrace.live.aggregates import Aggregates
from gputrace.live.alerts import Alerts, parse_alert
from gputrace.live.metrics import LiveCollector
from gputrace.trace.builder import CLASS_DEVICE, MiB, TraceBuilder
from tests.unit.live.test_live_aggregates import Clock, feed


def test_one_figure_per_process_never_the_layers_added() -> None:
    """24 MiB of RM video memory, 23 MiB of API allocations inside it: the process holds
    24 MiB (not 47); growth and the live_bytes alert read the same figure."""
    b = TraceBuilder()  # synthetic
    b.process(100, "train")
    dev = b.rm_alloc(0.0, 100, h_class=CLASS_DEVICE, gpu=0)
    for i in range(12):
        b.rm_alloc(0.1 + i / 100, 100, size=2 * MiB, parent=dev)
    for i in range(23):
        b.cuda_alloc(0.2 + i / 100, 100, MiB)
    agg = Aggregates(clock=Clock())
    feed(agg, b, "ioctls", "cuda_calls")
    (p,) = agg.snapshot().procs
    assert p.live == {("rm", 0): 24 * MiB, ("api", None): 23 * MiB}
    assert p.live_total == 24 * MiB
    held = [(s.labels["pid"], s.value) for m in LiveCollector(agg.snapshot).collect()
            for s in m.samples if m.name == "gputrace_held_bytes"]
    assert held == [("100", 24 * MiB)]
    fired = Alerts([parse_alert("live_bytes>30MiB")], err=lambda _s: None).evaluate(
        agg.snapshot())
    assert fired == []  # 47 MiB added would have fired


def test_orphaned_bytes_from_the_drivers_accounting() -> None:
    """The driver charges 1 GiB to pid 100 (traced, live), 512 MiB to pid 200 (exited:
    its child keeps the context) and 256 MiB to pid 4242 (never seen: another PID
    namespace). Orphaned on GPU 0: 768 MiB; then a new round without pid 200: 256 MiB."""
    b = TraceBuilder()  # synthetic
    b.process(100, "train")
    b.process(200, "loader", exit=1.0)
    b.cuda_alloc(0.1, 100, MiB)
    b.gpu_process_memory(2.0, 0, 100, 1024 * MiB)
    b.gpu_process_memory(2.0, 0, 200, 512 * MiB)
    b.gpu_process_memory(2.0, 0, 4242, 256 * MiB)
    agg = Aggregates(clock=Clock())
    feed(agg, b, "cuda_calls", "processes", "gpu_process_memory")
    snap = agg.snapshot()
    assert snap.orphaned == {0: 768 * MiB}
    lines: list[str] = []
    alerts = Alerts([parse_alert("orphaned>512MiB")], err=lines.append)
    (f,) = alerts.evaluate(snap)
    assert f.value == 768 * MiB and "768.0 MiB" in lines[0]
    metrics = {(m.name, tuple(s.labels.items())): s.value
               for m in LiveCollector(agg.snapshot).collect() for s in m.samples}
    assert metrics[("gputrace_orphaned_bytes", (("gpu", "0"),))] == 768 * MiB
    b.gpu_process_memory(3.0, 0, 100, 1024 * MiB)
    b.gpu_process_memory(3.0, 0, 4242, 256 * MiB)
    feed(agg, b, "gpu_process_memory")
    assert agg.snapshot().orphaned == {0: 256 * MiB}
    assert alerts.evaluate(agg.snapshot()) == []
