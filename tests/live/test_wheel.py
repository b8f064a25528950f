"""The built wheel records on its own: installed in a fresh virtual environment (with
Debian's bcc made visible as scripts/setup.sh does), run from outside the checkout,
`gputrace doctor` passes and `gputrace record` traces the stand-in driver's workload
with the BPF sources the wheel ships."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from gputrace.trace.reader import open_trace
from tests.install_helpers import CONSTRAINTS, ROOT, make_venv, python_sh
from tests.record_helpers import RUN_S, live_skip_reason, standin_driver_args

pytestmark = [pytest.mark.live, pytest.mark.install]
_SKIP = live_skip_reason()
if _SKIP is not None:
    pytestmark.append(pytest.mark.skip(reason=_SKIP))


def _run(argv: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    # no PYTHONPATH: nothing may come from the checkout
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_wheel_installs_and_records_the_standin(tmp_path: Path) -> None:
    """Guards the package data: the wheel holds probes/ as gputrace.probes, and a
    recording from the installed package (not the checkout) compiles them and
    captures the stand-in workload's every ioctl. Without the sources in the wheel,
    record fails."""
    from tests.standin.standin import build, load_expected_json, mounted_driver

    wheels = tmp_path / "wheels"
    r = _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
              "--disable-pip-version-check", "-w", str(wheels), str(ROOT)], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    (wheel,) = wheels.glob("gputrace-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "gputrace/probes/syscalls.bpf.c" in names and "gputrace/probes/cuda.bpf.c" in names
    # the compiled snapshot reader, built where a compiler is (this machine has one)
    assert any(n.startswith("gputrace/importers/_entry_scan.") and n.endswith(".so")
               for n in names), names

    python = make_venv(tmp_path / "venv")
    r = _run([str(python), "-m", "pip", "install", "--quiet", "--no-compile",
              "--disable-pip-version-check", "-c", str(CONSTRAINTS), f"{wheel}[record]"],
             cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    r = python_sh('bcc_visible "$1"', str(python))
    assert r.returncode == 0, r.stderr
    gputrace = python.parent / "gputrace"
    work = tmp_path / "elsewhere"
    work.mkdir()
    r = _run([str(python), "-c", "import gputrace; print(gputrace.__file__)"], cwd=work)
    assert r.returncode == 0 and r.stdout.startswith(str(tmp_path / "venv")), r

    wl = build().workload
    out = work / "trace"
    with mounted_driver(tmp_path, budget=1 << 30) as dev:
        # no NVIDIA driver on a test host: doctor looks at the stand-in's devices
        r = _run([str(gputrace), "doctor", "--device-dir", str(dev)], cwd=work)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "bcc importable" in r.stdout
        r = _run([str(gputrace), "record", "-o", str(out), "--device-dir", str(dev),
                  *standin_driver_args(), "--", str(wl), str(dev)], cwd=work, timeout=RUN_S)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "DONE" in r.stdout
    t = open_trace(out)
    assert t.status == "complete" and t.layers[0] == "syscall"
    assert t.scan("ioctls").collect().height == load_expected_json()["ioctls_total"]
