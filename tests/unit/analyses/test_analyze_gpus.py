"""Which GPU holds RM memory, from the device object each allocation hangs under.

Scenario (synthetic, syscall layer only, no PMM chunks), pid 20 `trainer`:
  client -> device on GPU 0 (deviceId 0) -> 3 x 1 GiB vidmem
  client -> device on GPU 1 (deviceId 1) -> subdevice -> 1 x 1 GiB vidmem
Answer: GPU 0 peaks at 3 GiB, GPU 1 at 1 GiB; imbalance max/mean = 3 / 2 = 1.5.
"""

from __future__ import annotations

from pathlib import Path

from gputrace.trace.builder import CLASS_DEVICE, CLASS_SUBDEVICE, GiB, TraceBuilder
from tests.analyze_helpers import analyze

CLIENT = 0xC1D00000


def test_memory_is_attributed_to_its_devices_gpu(tmp_path: Path) -> None:
    b = TraceBuilder(layers=("syscall",), duration_s=5.0, gpus=2)
    b.process(20, "trainer")
    b.rm_alloc(0.0, 20, h_class=0x41, handle=CLIENT, client=CLIENT, parent=0)
    d0 = b.rm_alloc(0.1, 20, h_class=CLASS_DEVICE, client=CLIENT, gpu=0)
    d1 = b.rm_alloc(0.1, 20, h_class=CLASS_DEVICE, client=CLIENT, gpu=1)
    s1 = b.rm_alloc(0.2, 20, h_class=CLASS_SUBDEVICE, client=CLIENT, parent=d1)
    for k in range(3):
        b.rm_alloc(1.0 + k, 20, size=GiB, client=CLIENT, parent=d0)
    b.rm_alloc(1.0, 20, size=GiB, client=CLIENT, parent=s1)
    gpus = analyze(b.build(tmp_path / "t"), ["summary"])["summary"]["gpus"]
    assert gpus["source"] == "rm allocations"
    peaks = {g["gpu_index"]: g["peak_bytes"] for g in gpus["gpus"]}
    assert peaks == {0: 3 * GiB, 1: GiB}
    assert gpus["imbalance_peak"] == 1.5
