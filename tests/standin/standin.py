"""TEST STAND-IN helpers: build, mount and drive the fake NVIDIA driver (nvfuse).

Not NVIDIA code and not a driver. ``nvfuse`` is a FUSE filesystem whose files
(nvidiactl, nvidia0.., nvidia-uvm, nvidia-uvm-tools) answer the RM and UVM ioctls
with driver-580 layouts; ``workload`` issues a known sequence of them, described by
``expected.json`` (``workload --print-expected``). See README.md in this directory.

Typical use in a test::

    from tests.standin.standin import mounted_driver, run_workload, skip_reason

    @pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")
    def test_x(tmp_path):
        with mounted_driver(tmp_path, budget=1 << 30) as dev:
            r = run_workload(dev, "--repeat", "2")
            assert r.stdout == "DONE\\n"
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BUILD_DIR = HERE / "build"
EXPECTED_JSON = HERE / "expected.json"
DEFAULT_BUDGET = 16 << 30
DRIVER_VERSION = "580.142"
"""The driver whose parameter layouts nvstandin.h copies: recorders must decode as it."""
MOUNT_TIMEOUT_S = 10.0
UNMOUNT_TIMEOUT_S = 10.0


class StandinUnavailable(RuntimeError):
    """The stand-in cannot be built or mounted on this machine."""


@dataclass(frozen=True)
class Binaries:
    nvfuse: Path
    workload: Path
    uvm_workload: Path = BUILD_DIR / "uvm_workload"


def _toolchain_problem(need_fuse: bool) -> str | None:
    for tool in ("gcc", "make"):
        if shutil.which(tool) is None:
            return f"{tool} not found (apt-get install build-essential)"
    if need_fuse:
        if shutil.which("pkg-config") is None:
            return "pkg-config not found (apt-get install pkg-config)"
        r = subprocess.run(["pkg-config", "--exists", "fuse3"], check=False)
        if r.returncode != 0:
            return "libfuse3 development files not found (apt-get install libfuse3-dev)"
    return None


def skip_reason(need_mount: bool = True) -> str | None:
    """Why the stand-in cannot run here, or None when it can.

    Mounting needs root: besides the mount itself, nvfuse reads and writes the
    calling process's memory through /proc/<pid>/mem.
    """
    problem = _toolchain_problem(need_fuse=need_mount)
    if problem or not need_mount:
        return problem
    if os.geteuid() != 0:
        return "the NVIDIA stand-in needs root (FUSE mount and /proc/<pid>/mem access)"
    if not Path("/dev/fuse").exists():
        return "/dev/fuse is missing"
    if shutil.which("fusermount3") is None:
        return "fusermount3 not found (apt-get install fuse3)"
    return None


def build(*targets: str) -> Binaries:
    """Run make in tests/standin (all targets by default) and return the binary paths.

    Raises StandinUnavailable with the reason when gcc, make or libfuse3-dev is
    missing or the build fails.
    """
    wanted = targets or ("nvfuse", "workload")
    problem = _toolchain_problem(need_fuse="nvfuse" in wanted or "noflushfs" in wanted)
    if problem:
        raise StandinUnavailable(problem)
    r = locked_make(HERE, [f"build/{t}" for t in wanted])
    if r is not None and r.returncode != 0:
        raise StandinUnavailable(f"building the stand-in failed:\n{r.stdout}{r.stderr}")
    return Binaries(nvfuse=BUILD_DIR / "nvfuse", workload=BUILD_DIR / "workload")


_MADE: set[tuple[Path, tuple[str, ...]]] = set()


def locked_make(directory: Path, targets: list[str]) -> subprocess.CompletedProcess[str] | None:
    """`make -C directory targets` once per test process (None when already made here).

    Parallel test workers (pytest-xdist) share the build directory: the lock keeps two
    of them from writing the same binary at once, or one from running a binary another
    is still writing. Sources do not change during a test session, so a second build of
    the same targets in one process would only cost a make run (hundreds of calls)."""
    key = (directory, tuple(targets))
    if key in _MADE:
        return None
    build_dir = directory / "build"
    build_dir.mkdir(exist_ok=True)
    with (build_dir / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        r = subprocess.run(["make", "-C", str(directory), *targets], capture_output=True,
                           text=True, check=False)  # fmt: skip
    if r.returncode == 0:
        _MADE.add(key)
    return r


def _unmount(mnt: Path, proc: subprocess.Popen[bytes]) -> None:
    if os.path.ismount(mnt):
        r = subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True, check=False)
        if r.returncode != 0:
            # Busy (a process still holds a file): detach lazily, the server still exits.
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True,
                           check=False)
    try:
        proc.wait(timeout=UNMOUNT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def mounted_driver(
    tmp_path: Path,
    budget: int = DEFAULT_BUDGET,
    gpus: int = 1,
    verbose: bool = False,
    event_log: Path | None = None,
    foreign: tuple[int, int] | None = None,
) -> Iterator[Path]:
    """Mount nvfuse on tmp_path/"nvdev" in the foreground, yield that directory, unmount.

    ``budget`` is the vidmem per GPU in bytes. The server's stderr (``--verbose``:
    one line per request) goes to tmp_path/"nvfuse.log". ``event_log``: where the
    server writes its JSON-lines log of UVM tools events, trackers and uvm releases.
    ``foreign``: (pid, bytes) the driver's GET_PIDS / GET_PID_INFO list on GPU 0 with no
    client of its own, as the host pid of another PID namespace's process.
    """
    bins = build()
    mnt = tmp_path / "nvdev"
    mnt.mkdir(exist_ok=True)
    log = tmp_path / "nvfuse.log"
    cmd = [str(bins.nvfuse), str(mnt), "--budget", str(budget), "--gpus", str(gpus), "-f"]
    if verbose:
        cmd.append("--verbose")
    if foreign is not None:
        cmd += ["--foreign-pid", f"{foreign[0]}:{foreign[1]}"]
    if event_log is not None:
        cmd += ["--event-log", str(event_log)]
    with log.open("wb") as logf:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf)
    try:
        deadline = time.monotonic() + MOUNT_TIMEOUT_S
        while not os.path.ismount(mnt):
            if proc.poll() is not None:
                raise StandinUnavailable(
                    f"nvfuse exited with {proc.returncode} before mounting:\n"
                    + log.read_text(errors="replace"))
            if time.monotonic() > deadline:
                raise StandinUnavailable(f"nvfuse did not mount {mnt} in {MOUNT_TIMEOUT_S}s")
            time.sleep(0.01)
        yield mnt
    finally:
        _unmount(mnt, proc)


@dataclass
class NoFlushMount:
    """A mounted noflushfs: `file` never answers FLUSH but to its openers; `log`
    holds one "HUNG FLUSH pid N" line per close left hanging."""

    mnt: Path
    file: Path
    log: Path

    def hung_pids(self) -> list[int]:
        return [int(x.split()[-1]) for x in self.log.read_text().splitlines()
                if x.startswith("HUNG FLUSH pid ")]  # fmt: skip


@contextlib.contextmanager
def noflush_mount(tmp_path: Path, content: Path | None = None,
                  hang: str | None = None) -> Iterator[NoFlushMount]:
    """Mount the hostile noflushfs on tmp_path/"hostile" (its file holding `content`'s
    bytes; with `hang`, only the FLUSH of processes whose command line holds it left
    unanswered); on the way out its server is killed (which aborts every FLUSH left
    hanging, so the stuck closes return) and the mount detached."""
    build("noflushfs")
    mnt = tmp_path / "hostile"
    mnt.mkdir(exist_ok=True)
    log = tmp_path / "noflushfs.log"
    with log.open("wb") as logf:
        extra = [] if content is None else [str(content), *([hang] if hang else [])]
        proc = subprocess.Popen([str(BUILD_DIR / "noflushfs"), str(mnt), *extra],
                                stdin=subprocess.DEVNULL, stdout=logf, stderr=logf)
    try:
        deadline = time.monotonic() + MOUNT_TIMEOUT_S
        while not os.path.ismount(mnt):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise StandinUnavailable("noflushfs did not mount:\n"
                                         + log.read_text(errors="replace"))
            time.sleep(0.01)
        yield NoFlushMount(mnt, mnt / "f", log)
    finally:
        proc.kill()
        proc.wait()
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True,
                       check=False)  # fmt: skip


def run_workload(
    devdir: Path | str, *args: str, timeout: float = 60.0, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run the known workload against devdir; with check, a non-zero exit raises."""
    bins = build("workload")
    return subprocess.run(
        [str(bins.workload), str(devdir), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
    )


def print_expected(exe: Path, *args: str) -> dict[str, Any]:
    """``EXE --print-expected ARGS``, parsed: every stand-in workload says what it does."""
    r = subprocess.run([str(exe), "--print-expected", *args], capture_output=True, text=True,
                       check=True)  # fmt: skip
    data: dict[str, Any] = json.loads(r.stdout)
    return data


def expected(*args: str) -> dict[str, Any]:
    """What the workload issues for the given options (``--repeat N``, ``--no-exit-free``)."""
    return print_expected(build("workload").workload, *args)


def load_expected_json() -> dict[str, Any]:
    """tests/standin/expected.json: the defaults (repeat 1, exit free)."""
    data: dict[str, Any] = json.loads(EXPECTED_JSON.read_text())
    return data


@dataclass
class WaitingWorkload:
    """A workload started with --wait, stopped after opening the devices and its client."""

    proc: subprocess.Popen[str]
    pid: int

    def go(self, timeout: float = 60.0) -> tuple[int, str, str]:
        """Let it run to the end; returns (exit code, stdout after READY, stderr)."""
        out, err = self.proc.communicate("go\n", timeout=timeout)
        return self.proc.returncode, out, err


@contextlib.contextmanager
def started_waiting(argv: list[str], env: Mapping[str, str] | None = None,
                    timeout: float = 30.0) -> Iterator[WaitingWorkload]:
    """Start a stand-in workload whose argv includes ``--wait`` and yield once it
    printed ``READY <pid>``; it is killed on the way out if still running."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env=None if env is None else dict(env))
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until READY or exit; bounded by the workload
        if not line.startswith("READY "):
            proc.kill()
            _, err = proc.communicate(timeout=timeout)
            raise RuntimeError(f"{Path(argv[0]).name} did not get ready: {line!r} {err}")
        yield WaitingWorkload(proc=proc, pid=int(line.split()[1]))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def waiting_workload(devdir: Path | str, *args: str,
                     timeout: float = 30.0) -> Iterator[WaitingWorkload]:
    """Start ``workload DEVDIR --wait ...`` and yield once it printed ``READY <pid>``."""
    bins = build("workload")
    with started_waiting([str(bins.workload), str(devdir), "--wait", *args],
                         timeout=timeout) as w:
        yield w


@dataclass
class StandinState:
    """Parsed .state of a mounted stand-in."""

    scalars: dict[str, int] = field(default_factory=dict)
    gpus: list[dict[str, int]] = field(default_factory=list)
    clients: list[dict[str, int]] = field(default_factory=list)
    objects: list[dict[str, Any]] = field(default_factory=list)
    uvm_ranges: list[dict[str, Any]] = field(default_factory=list)
    trackers: list[dict[str, Any]] = field(default_factory=list)
    uvm_releases: list[dict[str, Any]] = field(default_factory=list)


def _kv(words: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for w in words:
        if "=" in w:
            k, v = w.split("=", 1)
            try:
                out[k] = int(v, 0)
            except ValueError:
                out[k] = v
        else:
            out["type"] = w
    return out


def read_state(devdir: Path | str) -> StandinState:
    st = StandinState()
    for line in (Path(devdir) / ".state").read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        head, *rest = line.split()
        if head.startswith("gpu") and head[3:].isdigit():
            st.gpus.append(_kv(rest))
        elif head == "client":
            st.clients.append({"handle": int(rest[0], 0), **_kv(rest[1:])})
        elif head == "object":
            st.objects.append(_kv(rest))
        elif head == "uvm_range":
            st.uvm_ranges.append(_kv(rest))
        elif head == "tracker":
            st.trackers.append(_kv(rest))
        elif head == "uvm_release":
            st.uvm_releases.append(_kv(rest))
        else:
            st.scalars[head] = int(rest[0])
    return st


def wait_state(devdir: Path | str, cond: Callable[[StandinState], bool],
               timeout: float = 5.0) -> StandinState:
    """Read .state until cond holds. The kernel sends FUSE releases asynchronously, so
    the frees done at a process's last close can land a moment after it exited."""
    deadline = time.monotonic() + timeout
    while True:
        st = read_state(devdir)
        if cond(st) or time.monotonic() > deadline:
            return st
        time.sleep(0.01)
