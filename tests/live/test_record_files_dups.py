"""Live: the `files` table follows dup2, dup3 and fcntl(F_DUPFD_CLOEXEC), including
the close that dup2/dup3 do implicitly when the new fd is a tracked device (root)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from gputrace.trace.reader import open_trace
from tests.record_helpers import ROOT, live_skip_reason, record_cmd, standin_driver_args

pytestmark = [pytest.mark.live]
_SKIP = live_skip_reason()
if _SKIP is not None:
    pytestmark.append(pytest.mark.skip(reason=_SKIP))

SCRIPT = """
import fcntl, os, sys
d = sys.argv[1]
ctl = os.open(d + "/nvidiactl", os.O_RDWR)
uvm = os.open(d + "/nvidia-uvm", os.O_RDWR)
a = fcntl.fcntl(ctl, fcntl.F_DUPFD_CLOEXEC, 100)  # fcntl: a >= 100
os.dup2(ctl, uvm)                    # dup2: closes the uvm fd first
os.dup2(uvm, a, inheritable=False)   # dup3: closes a first
os.dup2(a, a)                        # same fd: nothing happens
os.close(uvm); os.close(a); os.close(ctl)
print(ctl, uvm, a)
"""


def test_files_dup2_dup3_fcntl(tmp_path: Path) -> None:
    from tests.standin.standin import mounted_driver

    out = tmp_path / "trace"
    with mounted_driver(tmp_path, budget=1 << 30) as dev:
        r = subprocess.run(
            record_cmd(out, "--device-dir", str(dev), *standin_driver_args(), "--",
                       sys.executable, "-c", SCRIPT, str(dev)),
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert r.returncode == 0, r.stderr
    ctl, uvm, a = (int(x) for x in r.stdout.split())
    assert a >= 100
    t = open_trace(out)
    assert t.status == "complete" and t.drops["fd_events"] == 0
    files = t.scan("files").sort("ts_ns", maintain_order=True).collect()
    rows = files.select("fd_op", "device", "fd", "new_fd", "ret").rows()
    assert rows == [
        ("open", "ctl", ctl, None, ctl),
        ("open", "uvm", uvm, None, uvm),
        ("dup", "ctl", ctl, a, a),  # fcntl(F_DUPFD_CLOEXEC)
        ("close", "uvm", uvm, None, None),  # implicit, by dup2
        ("dup", "ctl", ctl, uvm, uvm),  # dup2
        ("close", "ctl", a, None, None),  # implicit, by dup3
        ("dup", "ctl", uvm, a, a),  # dup3
        ("close", "ctl", uvm, None, 0),
        ("close", "ctl", a, None, 0),
        ("close", "ctl", ctl, None, 0),
    ]
    assert files["pid"].n_unique() == 1 and files["tid"].to_list() == files["pid"].to_list()
    assert files.filter(pl.col("gpu_index").is_not_null()).height == 0
