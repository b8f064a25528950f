"""What the storm benchmarks share: building a storm program and starting
`gputrace record` the way the live tests do (waiting on its ready line, with a
deadline, while a thread keeps draining its stderr)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.record_helpers import RecorderProc, record_cmd  # noqa: E402


def build_storm(source: Path, tmp: Path) -> Path:
    """gcc -O2 the storm program `source` into tmp; returns the executable."""
    exe = tmp / "storm"
    subprocess.run(["gcc", "-O2", "-o", str(exe), str(source)], check=True)
    return exe


def device_dirs(tmp: Path) -> tuple[Path, Path]:
    """tmp/dev holding `nvidiactl` and `nvidia-uvm` and tmp/other holding `notnvidia`, all
    mknod copies of /dev/null: the recorder's device folder and an ioctl target outside it."""
    dev, other = tmp / "dev", tmp / "other"
    dev.mkdir()
    other.mkdir()
    os.mknod(dev / "nvidiactl", 0o666 | 0o020000, os.makedev(1, 3))
    os.mknod(dev / "nvidia-uvm", 0o666 | 0o020000, os.makedev(1, 3))  # STORM_UVM=1 storms
    os.mknod(other / "notnvidia", 0o666 | 0o020000, os.makedev(1, 3))
    return dev, other


def start_recorder(out: Path, *args: str) -> RecorderProc:
    """`gputrace record -o out --force ARGS`, returned once every probe is attached."""
    rec = RecorderProc(record_cmd(out, "--force", *args))
    rec.wait_ready()
    return rec


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used so far."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def oom_program(tmp: Path) -> tuple[Path, Path]:
    """A program asking the stand-in libcuda for 1 TiB (refused: over
    GPUTRACE_STANDIN_CUDA_MAX, CUDA_ERROR_OUT_OF_MEMORY; it exits 0 when so) and the
    stand-in libcuda it is linked against: (program, libcuda)."""
    from tests.standin_cuda.standin_cuda import HERE, build, link_program

    return link_program(HERE / "oom_program.c", tmp / "oom"), build().libcuda
