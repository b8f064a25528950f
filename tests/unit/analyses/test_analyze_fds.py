"""RM memory dies when the control fd holding its client loses its last reference.

Scenario (synthetic), pid 10 `job`, the answer beside each line:
  t=0   open nvidiactl as fd 3; root client 0xC1D00000 allocated on fd 3
  t=1   16 MiB vidmem on fd 3                 -> ends at t=5 (last close of fd 3's file)
  t=1   64 KiB RM_ALLOC_MEMORY on nvidia0 fd 4 -> ends at t=5 too: its client is fd 3's
  t=2   dup(3) -> 5
  t=3   close(3)                              -> nothing freed, fd 5 still refers to it
  t=4   close(4)                              -> nothing freed (not the client's fd)
  t=5   close(5)                              -> the file is released: both objects end
  the process runs on to t=10, so nothing is alive at the end.
"""

from __future__ import annotations

from pathlib import Path

from gputrace.trace.builder import KiB, MiB, TraceBuilder
from tests.analyze_helpers import analyze

CLIENT = 0xC1D00000


def build(tmp_path: Path, *, last_close: bool = True) -> Path:
    b = TraceBuilder(layers=("syscall",), duration_s=10.0)
    b.process(10, "job")
    b.open_fd(0.0, 10, fd=3)
    b.rm_alloc(0.0, 10, h_class=0x41, handle=CLIENT, client=CLIENT, parent=0)
    b.rm_alloc(1.0, 10, size=16 * MiB, client=CLIENT)
    b.open_fd(1.0, 10, fd=4, device_code=2)
    b.ioctl(1.0, 10, "RM_ALLOC_MEMORY", fd=4, device_code=2, h_client=CLIENT,
            h_parent=CLIENT, h_object=0xBEEF, h_class=0x71, size_bytes=64 * KiB)
    b.dup_fd(2.0, 10, fd=3, new_fd=5)
    b.close(3.0, 10, fd=3)
    b.close(4.0, 10, fd=4, device_code=2)
    if last_close:
        b.close(5.0, 10, fd=5)
    return b.build(tmp_path / "t")


def test_last_close_of_the_clients_file_frees_everything(tmp_path: Path) -> None:
    leaks = analyze(build(tmp_path), ["leaks"])["leaks"]
    assert leaks["allocations"] == []
    assert leaks["bytes_by_layer"]["rm"] == 0


def test_earlier_closes_free_nothing(tmp_path: Path) -> None:
    leaks = analyze(build(tmp_path, last_close=False), ["leaks"])["leaks"]
    got = sorted((a["id"], a["size_bytes"], a["kind"]) for a in leaks["allocations"])
    assert [g[1:] for g in got] == [(64 * KiB, "alive_at_end"), (16 * MiB, "alive_at_end")]
