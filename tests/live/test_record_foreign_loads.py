"""`record -p PID` serves its targets only: an unrelated process that loads (a copy
of) libcuda during the recording, from before the API layer is configured until
after it stops, is neither registered (its Python is not walked) nor attached (no
uprobes on its copy) (root, bcc)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from gputrace.trace.reader import open_trace
from tests.record_helpers import live_skip_reason, record_py_workload

pytestmark = [pytest.mark.live]
_SKIP = live_skip_reason()
if _SKIP is not None:
    pytestmark.append(pytest.mark.skip(reason=_SKIP))

PROBED = 19  # symbols of the stand-in libcuda the API layer hooks (test_record_api.PROBED)
# The bystander: loads its copy of libcuda, then opens it again and again (each
# open is a library load to the probes) until its stdin closes.
BYSTANDER = """
import ctypes, os, sys, threading
lib = sys.argv[1]
ctypes.CDLL(lib)
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
print("LOADED", os.getpid(), flush=True)
while not done.wait(0.005):
    os.close(os.open(lib, os.O_RDONLY))
"""


def test_p_ignores_other_processes_loading_libcuda(tmp_path: Path) -> None:
    from tests.standin_cuda.standin_cuda import build

    lib = build().libcuda
    copy = tmp_path / "lib" / "libcuda.so.1"
    copy.parent.mkdir()
    shutil.copy(lib, copy)
    other = subprocess.Popen([sys.executable, "-c", BYSTANDER, str(copy)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert other.stdout is not None
    out = tmp_path / "trace"
    try:
        assert other.stdout.readline() == f"LOADED {other.pid}\n"
        # the bystander keeps loading while the recorder compiles, configures and runs
        pid = record_py_workload(out, sys.executable)
        assert other.poll() is None  # it loaded all along
    finally:
        other.kill()
        other.wait()
    t = open_trace(out)
    api = t.manifest["api"]
    assert api["python"]["versions"] == {str(pid): "{}.{}".format(*sys.version_info[:2])}
    assert api["libraries"] == [str(lib)]
    # the API layer's own hooks (other layers' probes on libcuda name their function)
    hooks = [h for h in t.manifest["hooks"]["attached"] if not h.endswith(")")]
    assert sum(h.startswith("uprobe:") for h in hooks) == PROBED
    assert sum(h.startswith("uretprobe:") for h in hooks) == PROBED
    assert not any(str(copy) in h for h in hooks)
    calls = t.scan("cuda_calls").collect()
    assert calls["pid"].unique().to_list() == [pid]
    assert calls.filter(pl.col("func") == "cuMemAlloc_v2").height > 0
