"""Live: RM_VID_HEAP_CONTROL recorded by the real probe on the FUSE stand-in. The
NVOS32 function decides the row: function 2 (alloc) carries the size, flags @52,
attr, alignment, offset and address; function 3 (free) carries flags @48 and no
size. The leak analysis then ends the freed block by its free and the kept one by
the control fd's close (root)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from gputrace.trace.reader import open_trace
from tests.analyze_helpers import analyze
from tests.record_helpers import ROOT, live_skip_reason, record_cmd, standin_driver_args

pytestmark = [pytest.mark.live]
_SKIP = live_skip_reason()
if _SKIP is not None:
    pytestmark.append(pytest.mark.skip(reason=_SKIP))

MIB = 1 << 20
SCRIPT = r"""
import fcntl, os, struct, sys
NVOS21 = struct.Struct("<IIIIQII")
NVOS64 = struct.Struct("<IIIIQQIII4x")
NVOS32 = struct.Struct("<IIIIh2xIQQ" "IIIIIIIIIII4xQQQQQ" "56x")
def call(fd, cmd, s, *f):
    b = bytearray(s.pack(*f)); fcntl.ioctl(fd, cmd, b); return s.unpack(bytes(b))
ctl = os.open(sys.argv[1] + "/nvidiactl", os.O_RDWR)
client = call(ctl, 0xC020462B, NVOS21, 0, 0, 0, 0, 0, 0, 0)[2]
assert call(ctl, 0xC030462B, NVOS64, client, client, 0x100, 0x80, 0, 0, 0, 0, 0)[8] == 0
hs = []
for size, flags in ((5 << 20, 0x1), (3 << 20, 0x4)):
    out = call(ctl, 0xC0B8464A, NVOS32, client, 0x100, 2, 0, 0, 0, 0, 0, 0, 0, 0, flags,
               0x20, 0, 0, 0, 0, 0, 0, size, 0, 0, 0, 0)
    assert out[5] == 0, out
    hs.append(out[9])
free = call(ctl, 0xC0B8464A, NVOS32, client, 0x100, 3, 0, 0, 0, 0, 0, 0, hs[0], 0x8, 0, 0,
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
assert free[5] == 0, free
os.close(ctl)
print(client, *hs)
"""


def test_vid_heap_alloc_and_free_rows(tmp_path: Path) -> None:
    from tests.standin.standin import mounted_driver

    out = tmp_path / "trace"
    with mounted_driver(tmp_path, budget=1 << 30) as dev:
        r = subprocess.run(
            record_cmd(out, "--device-dir", str(dev), *standin_driver_args(), "--",
                       sys.executable, "-c", SCRIPT, str(dev)),
            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    client, h1, h2 = (int(x) for x in r.stdout.split())
    t = open_trace(out)
    heap = (t.scan("ioctls").filter(pl.col("name") == "RM_VID_HEAP_CONTROL")
            .sort("ts_ns").collect())
    rows = heap.select("ctrl_cmd", "h_client", "h_parent", "h_object", "size_bytes", "flags",
                       "attr", "status").rows()
    assert rows == [
        (2, client, 0x100, h1, 5 * MIB, 0x1, 0x20, 0),
        (2, client, 0x100, h2, 3 * MIB, 0x4, 0x20, 0),
        (3, client, 0x100, h1, None, 0x8, None, 0),
    ]
    leaks = analyze(out, ["leaks"])["leaks"]
    assert leaks["allocations"] == []
    # h1 ended by its VID_HEAP free; h2 torn down by the last close of nvidiactl
    assert leaks["rm_freed_by_fd_close"] == {"count": 1, "bytes": 3 * MIB}
