"""The set-up: the lock resolves the dev install quickly, the scripts pick an
interpreter that accepts installs and let it import Debian's bcc, and the BPF sources
are found in a checkout and through an editable install.

Tests marked `install` make fresh virtual environments and reach PyPI (slow):
`python3 -m pytest -m install tests/test_install.py`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from gputrace.errors import GputraceError
from gputrace.record import loader
from tests.install_helpers import CONSTRAINTS, ROOT, SYSTEM_BCC, make_venv, python_sh

RESOLVE_LIMIT_S = 600
"""How long resolving `.[dev]` may take. Without the lock pip backtracked through
botocore releases (s3fs/aiobotocore pins beside moto and boto3) for over 20 minutes;
with it, pip resolved it in 223 s (cold cache, a 2-core host at load 15: the time
is downloads, pip reads each wheel whole), 41 s from its cache (docs/testing.md)."""


def _pins(python: Path) -> dict[str, str]:
    """The constraints file's pins that apply to `python` (name -> version)."""
    env = json.loads(subprocess.run(
        [str(python), "-c", "import json, platform, sys, os\n"
         "v = sys.version_info\n"
         "print(json.dumps({'python_version': f'{v[0]}.{v[1]}',"
         " 'python_full_version': platform.python_version(),"
         " 'sys_platform': sys.platform, 'platform_system': platform.system(),"
         " 'platform_machine': platform.machine(),"
         " 'implementation_name': sys.implementation.name,"
         " 'platform_python_implementation': platform.python_implementation()}))"],
        capture_output=True, text=True, check=True).stdout)  # fmt: skip
    marker_env = {**default_environment(), **env}
    pins: dict[str, str] = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(marker_env):
            (spec,) = req.specifier
            assert spec.operator == "==", line
            pins[canonicalize_name(req.name)] = spec.version
    return pins


@pytest.mark.install
def test_dev_set_up_resolves_in_minutes_and_every_package_is_pinned(tmp_path: Path) -> None:
    """Guards the dev set-up's resolution: `pip install --dry-run` of `.[dev]` with
    requirements/constraints.txt, in a fresh virtual environment, finishes within
    RESOLVE_LIMIT_S (without a lock it ran 20 minutes without resolving), and every
    package it would install has an exact pin in the file, at that version: a package
    left unpinned is one the resolver could backtrack through again."""
    assert CONSTRAINTS.is_file(), "requirements/constraints.txt is missing (scripts/lock.sh)"
    python = make_venv(tmp_path / "venv")
    report = tmp_path / "report.json"
    start = time.monotonic()
    try:
        r = subprocess.run(
            [str(python), "-m", "pip", "install", "--dry-run", "--ignore-installed",
             "--quiet", "--disable-pip-version-check", "--report", str(report),
             "-c", str(CONSTRAINTS), f"{ROOT}[dev]"],
            capture_output=True, text=True, timeout=RESOLVE_LIMIT_S, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"resolving .[dev] took over {RESOLVE_LIMIT_S} s")
    took = time.monotonic() - start
    assert r.returncode == 0, r.stderr[-3000:]
    resolved = {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"]
                for i in json.loads(report.read_text())["install"]}  # fmt: skip
    resolved.pop("gputrace")
    pins = _pins(python)
    unpinned = sorted(set(resolved) - set(pins))
    assert not unpinned, f"resolved but not pinned: {unpinned}"
    assert {n: v for n, v in resolved.items() if pins[n] != v} == {}
    for name in ("pytest", "mypy", "ruff", "mutmut", "moto", "boto3", "s3fs", "dask",
                 "prometheus-client", "polars"):  # fmt: skip
        assert name in resolved, name
    print(f"resolved .[dev] ({len(resolved)} packages) in {took:.1f} s")


@pytest.mark.install
def test_editable_install_maps_the_probes_package_to_probes(tmp_path: Path) -> None:
    """Guards the package-dir mapping under an editable install: from outside the
    checkout, `gputrace.probes` is the checkout's probes/ (its BPF sources, not a copy)."""
    python = make_venv(tmp_path / "venv")
    r = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps",
                        "--disable-pip-version-check", "-e", str(ROOT)],
                       capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run([str(python), "-c", "import importlib.resources as r; "
                        "print(r.files('gputrace.probes'))"],
                       cwd=tmp_path, capture_output=True, text=True, check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()) == ROOT / "probes"


def test_probes_found_in_the_checkout() -> None:
    """Run from the checkout with no install, the sources are its probes/."""
    assert loader.probes_dir() == ROOT / "probes"
    assert (loader.PROBES / loader.MAIN).is_file()


def test_missing_probe_sources_are_a_one_line_error(tmp_path: Path) -> None:
    """Guards an install without its BPF sources: a GputraceError naming the file,
    not a FileNotFoundError traceback."""
    with pytest.raises(GputraceError, match=r"BPF sources are missing .*syscalls\.bpf\.c"):
        loader.probe_source(tmp_path)


def _pick(python: str) -> str:
    r = python_sh('pick_python && echo "$PY"', env={**os.environ, "PYTHON": python})
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_setup_uses_a_venv_when_the_python_refuses_installs(tmp_path: Path) -> None:
    """Guards the PEP 668 choice of scripts/python.sh: an externally managed
    interpreter (Debian 12's /usr/bin/python3) gets the checkout's .venv; a virtual
    environment's python, and one that accepts installs, are used as they are."""
    debian = Path("/usr/bin/python3")
    venv_python = make_venv(tmp_path / "venv", pip=False)
    assert _pick(str(venv_python)) == str(venv_python)
    base = subprocess.run([sys.executable, "-c", "import sys; print(sys.base_prefix)"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    plain = Path(base) / "bin" / "python3"
    if plain.exists() and not list(Path(base).glob("lib/python3*/EXTERNALLY-MANAGED")):
        assert _pick(str(plain)) == str(plain)
    if not list(Path("/usr/lib").glob("python3.*/EXTERNALLY-MANAGED")) or not debian.exists():
        pytest.skip("no externally managed /usr/bin/python3 here")
    assert _pick(str(debian)) == str(ROOT / ".venv" / "bin" / "python")


@pytest.mark.skipif(not SYSTEM_BCC.is_dir(), reason="no Debian bcc (python3-bpfcc)")
def test_bcc_visible_makes_debian_bcc_alone_importable(tmp_path: Path) -> None:
    """Guards bcc_visible (scripts/python.sh): in a fresh virtual environment Debian's
    bcc imports afterwards and not before, and no other module of dist-packages does."""
    python = make_venv(tmp_path / "venv", pip=False)

    def imports(module: str) -> bool:
        return subprocess.run([str(python), "-c", f"import {module}"], cwd=tmp_path,
                              capture_output=True, check=False).returncode == 0  # fmt: skip

    assert not imports("bcc")
    r = python_sh('bcc_visible "$1"', str(python))
    assert r.returncode == 0, r.stderr
    assert imports("bcc")
    if (SYSTEM_BCC.parent / "apt").is_dir():  # Debian's python3-apt: still not importable
        assert not imports("apt")


def test_live_options_without_the_record_extra_are_a_one_line_error() -> None:
    """Guards the base install (no `[record]` extra, so no prometheus_client): the live
    options' module says which extra to install instead of an ImportError traceback."""
    r = subprocess.run(
        [sys.executable, "-c", "import sys; sys.modules['prometheus_client'] = None\n"
         "from gputrace.errors import GputraceError\n"
         "try:\n    import gputrace.live.metrics\n"
         "except GputraceError as e:\n    print(e)"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "pip install 'gputrace[record]'" in r.stdout
