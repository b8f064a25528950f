"""`gputrace record` option handling and one-line errors (no BPF needed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gputrace.errors import UsageError
from gputrace.record import driver_version as driver
from gputrace.record import procfs

ROOT = Path(__file__).resolve().parents[3]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gputrace.cli", "record", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def _one_line_error(r: subprocess.CompletedProcess[str], text: str) -> None:
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gputrace: error:"), r.stderr
    assert text in lines[0]


def test_ebpf_prints_program_and_cflags() -> None:
    r = run("--ebpf", "--driver-version", "530.30.02")
    assert r.returncode == 0, r.stderr
    assert "TRACEPOINT_PROBE(syscalls, sys_enter_ioctl)" in r.stdout
    assert "-DGT_NVOS21_STATUS_OFF=24" in r.stdout
    # Both programs, as bcc tools print theirs: the API layer's uprobes too.
    assert "// ---- API layer" in r.stdout and "-DGT_CUDA_RB_PAGES=" in r.stdout


def test_bad_driver_version() -> None:
    _one_line_error(run("--ebpf", "--driver-version", "5x0"), "bad --driver-version")


@pytest.mark.skipif(os.geteuid() != 0, reason="checks that come after the root check")
def test_output_exists_without_force(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    _one_line_error(run("-o", str(tmp_path / "t"), "-d", "1"), "already exists")


@pytest.mark.skipif(os.geteuid() != 0, reason="checks that come after the root check")
def test_bad_pid(tmp_path: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()  # reaped: its pid names no process (a reuse this soon is not expected)
    _one_line_error(run("-o", str(tmp_path / "t"), "-p", str(gone.pid)), "no such process")


def test_pid_out_of_range(tmp_path: Path) -> None:
    r = run("-o", str(tmp_path / "t"), "-p", "999999999")
    _one_line_error(r, "-p must be a whole number from 1 to 4194304")
    assert r.returncode == 2


@pytest.mark.skipif(os.geteuid() != 0, reason="checks that come after the root check")
def test_missing_device_dir(tmp_path: Path) -> None:
    _one_line_error(run("-o", str(tmp_path / "t"), "--device-dir", str(tmp_path / "no")),
                    "no such directory")  # fmt: skip


@pytest.mark.skipif(os.geteuid() == 0, reason="runs as non-root only")
def test_not_root(tmp_path: Path) -> None:
    _one_line_error(run("-o", str(tmp_path / "t")), "needs root")


def test_missing_bcc_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    from gputrace.errors import GputraceError
    from gputrace.record import loader

    monkeypatch.setattr(loader, "_SYSTEM_DIST", "/nonexistent")
    monkeypatch.setitem(sys.modules, "bcc", None)
    with pytest.raises(
        GputraceError, match=r"apt-get install python3-bpfcc.*dnf install python3-bcc"
    ):
        loader.import_bcc()


def test_driver_layouts_by_version() -> None:
    def off(v: str, cmd: int) -> dict[str, int | None]:
        lay = {x.cmd: x for x in driver.resolve(v).layouts}[cmd]
        return {"status": lay.status, "ref_fd": lay.ref_fd}

    assert off("545.29.06", 33) == {"status": 1196, "ref_fd": 1184}
    assert off("550.54.14", 33) == {"status": 9260, "ref_fd": 9248}
    assert off("580.142", 34)["status"] == 16
    assert off("590.44.01", 34)["status"] == 8
    assert off("550.40.07", 42)["status"] == 36
    assert off("545.29.06", 42)["status"] == 32
    assert driver.rm_defines(driver.parse_version("520.61.05"))["GT_NVOS64_40_STATUS_OFF"] == 32
    with pytest.raises(UsageError):
        driver.parse_version("latest")


def test_device_kinds_and_cgroup_path() -> None:
    assert procfs.classify("/dev/nvidiactl", "/dev/") == (1, -1)
    assert procfs.classify("/dev/nvidia3", "/dev/") == (2, 3)
    assert procfs.classify("/dev/nvidia-uvm-tools", "/dev/") == (4, -1)
    assert procfs.classify("/dev/nvidia-modeset", "/dev/") is None
    assert procfs.classify("/tmp/nvidiactl", "/dev/") is None
    assert procfs.cgroup_path("0::/user.slice/x\n") == "/user.slice/x"
    # v1 only: the memory controller's path, wherever its line is; nothing: None
    v1 = "12:cpu,cpuacct:/a\n7:memory:/kubepods/pod1/c\n1:name=systemd:/b\n"
    assert procfs.cgroup_path(v1) == "/kubepods/pod1/c"
    assert procfs.cgroup_path("") is None and procfs.cgroup_path("garbage\n") is None


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (["--uvm-queue-entries", "1000"], "--uvm-queue-entries must be a power of two, not 1000"),
        (["--uvm-queue-entries", "1"], "--uvm-queue-entries must be a whole number from 2"),
        (["--uvm-queue-entries", str(1 << 23)], "--uvm-queue-entries must be a whole number"),
        (["--uvm-queue-entries", "-4"], "--uvm-queue-entries"),
        (["--sample-interval", "0"], "--sample-interval must be from 1 ms to 1 h"),
        (["--sample-interval", "soon"], "--sample-interval: cannot read"),
        (["--sample-interval", "2h"], "--sample-interval must be from 1 ms to 1 h"),
        (["--pid-memory-interval", "0"], "--pid-memory-interval must be from 1 ms to 1 h"),
        (["--pid-memory-interval", "often"], "--pid-memory-interval: cannot read"),
        (["--uvm-queue-version", "3"], "--uvm-queue-version must be a whole number from 1 to 2"),
        (["--kube-root", "/no/such/node"], "--kube-root /no/such/node: no such directory"),
    ],
)
def test_driver_layer_options_refused_before_anything_starts(
    tmp_path: Path, args: list[str], text: str
) -> None:
    r = run("-o", str(tmp_path / "t"), *args, "--", "true")
    _one_line_error(r, text)
    assert r.returncode == 2
    assert not (tmp_path / "t").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="checks that come after the root check")
def test_queue_version_the_driver_lacks_is_a_usage_error(tmp_path: Path) -> None:
    # V2 queue records exist from 550.54.14 on: a 535 driver has only V1
    r = run("-o", str(tmp_path / "t"), "--driver-version", "535.104.05",
            "--uvm-queue-version", "2", "--device-dir", str(tmp_path), "--", "true")  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "gputrace: error:" in r.stderr


def test_driver_layer_off_without_device_files(tmp_path: Path) -> None:
    from gputrace.record.recorder import Options, Recorder

    rec = Recorder(Options(output=str(tmp_path / "t")))
    assert rec._driver_layer(str(tmp_path) + "/") is None  # neither nvidia-uvm-tools nor ctl
    (tmp_path / "nvidiactl").touch()
    layer = rec._driver_layer(str(tmp_path) + "/")
    assert layer is not None and layer.want_rm and layer.queue_entries == 1 << 16
    rec.opts.driver_layer = False  # --no-driver-layer
    assert rec._driver_layer(str(tmp_path) + "/") is None


@pytest.mark.parametrize("value", ["-1", "x", "65537", "1.5", "", "\u00b2", "1" * 5000])
def test_bad_spill_threshold_is_a_usage_error(tmp_path: Path, value: str) -> None:
    """GPUTRACE_SPILL_MIB (the writer backlog past which ioctl events are written raw)
    is checked before anything starts, as every option is."""
    r = subprocess.run([sys.executable, "-m", "gputrace.cli", "record", "-o",
                        str(tmp_path / "t"), "--", "true"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120,
                       env={**os.environ, "GPUTRACE_SPILL_MIB": value})  # fmt: skip
    _one_line_error(r, "GPUTRACE_SPILL_MIB=")
    assert r.returncode == 2
    assert not (tmp_path / "t").exists()


def test_spill_threshold_values(monkeypatch: pytest.MonkeyPatch) -> None:
    from gputrace.record.options import spill_bytes

    monkeypatch.delenv("GPUTRACE_SPILL_MIB", raising=False)
    assert spill_bytes() == 32 << 20
    for text, want in (("0", 0), ("1", 1 << 20), ("65536", 65536 << 20)):
        monkeypatch.setenv("GPUTRACE_SPILL_MIB", text)
        assert spill_bytes() == want


@pytest.mark.parametrize("value", ["\u0661\u0662", "\uff11", "\u00b2", " 1", "0" * 5000])
def test_spill_threshold_is_ascii_digits(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """Only ASCII digits make GPUTRACE_SPILL_MIB: int() read Arabic-Indic "١٢" as 12
    and full-width digits too, and raised on "²" (a traceback)."""
    from gputrace.record.options import spill_bytes

    monkeypatch.setenv("GPUTRACE_SPILL_MIB", value)
    with pytest.raises(UsageError, match="GPUTRACE_SPILL_MIB="):
        spill_bytes()


@pytest.mark.parametrize(("args", "text"), [
    (["--metrics", "\u00b2"], "--metrics: cannot read"),
    (["--metrics", "\u0661\u0662"], "--metrics: cannot read"),
    (["--metrics", "127.0.0.1:\u00b2"], "--metrics: cannot read"),
    (["--alert", "drops>0", "--on-alert", 'a "b'], "--on-alert: cannot split"),
    (["--alert", "drops>0", "--on-alert", "notify \\"], "--on-alert: cannot split"),
])  # fmt: skip
def test_live_options_refused_in_one_line(tmp_path: Path, args: list[str], text: str) -> None:
    """A port in non-ASCII digits (a traceback for "²", port 12 for "١٢") and an
    --on-alert shlex cannot split (a traceback) are one-line usage errors, before
    anything is recorded."""
    r = run("-o", str(tmp_path / "t"), *args, "--", "true")
    _one_line_error(r, text)
    assert "Traceback" not in r.stderr
    assert r.returncode == 2
    assert not (tmp_path / "t").exists()
