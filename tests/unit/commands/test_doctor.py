"""`gputrace doctor`: each check against a SYNTHETIC fake root, the exit status, and a
live run against the FUSE stand-in (devices, tools device and RM client answer)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from gputrace.cli import main
from gputrace.commands import doctor as d
from tests.standin import standin


def fake_root(tmp_path: Path, *, kprobes: bool, lockdown: str | None) -> d.Host:
    """SYNTHETIC host files: mounts, kernel config, BTF, driver version."""
    r = tmp_path / "root"
    (r / "proc").mkdir(parents=True)
    (r / "proc/mounts").write_text("tracefs /sys/kernel/tracing tracefs rw 0 0\n")
    cfg = "CONFIG_UPROBE_EVENTS=y\n" + ("CONFIG_KPROBES=y\n" if kprobes else "")
    (r / "proc/config.gz").write_bytes(gzip.compress(cfg.encode()))
    (r / "proc/self").mkdir()
    (r / "proc/self/status").write_text("CapEff:\t0000000000000000\n")
    (r / "sys/kernel/btf").mkdir(parents=True)
    (r / "sys/kernel/btf/vmlinux").write_bytes(b"")
    (r / "sys/kernel/btf/nvidia_uvm").write_bytes(b"")
    (r / "sys/module/nvidia_uvm").mkdir(parents=True)
    (r / "sys/module/nvidia_uvm/version").write_text("580.159.04\n")
    if lockdown is not None:
        (r / "sys/kernel/security").mkdir(parents=True)
        (r / "sys/kernel/security/lockdown").write_text(lockdown)
    (r / "lib/modules/6.0.0/build").mkdir(parents=True)
    return d.Host(root=r, devdir=str(tmp_path / "nodev"), release="6.0.0", euid=0)


def by_key(checks: list[d.Check]) -> dict[str, d.Check]:
    return {c.key: c for c in checks}


def test_checks_read_the_host_files(tmp_path: Path) -> None:
    c = by_key(d.run_checks(fake_root(tmp_path, kprobes=False,
                                      lockdown="none [integrity] confidentiality\n")))
    assert c["root"].state == d.OK
    assert c["kernel-headers"].state == d.OK
    assert c["tracefs"].detail == "mounted at /sys/kernel/tracing"
    assert c["uprobes"].state == d.OK
    assert c["kprobes"].state == d.WARN and "CONFIG_KPROBES=not set" in c["kprobes"].detail
    assert c["btf"].state == d.OK and "nvidia_uvm" in c["btf"].detail
    assert c["lockdown"].state == d.WARN and c["lockdown"].detail.startswith("integrity")
    assert c["driver"].state == d.OK and c["driver"].detail.startswith("580.159.04")
    assert c["devices"].state == d.NO
    assert c["uvm-tools"].state == d.NO and c["rm-client"].state == d.NO


def test_kprobes_on_and_no_lockdown(tmp_path: Path) -> None:
    c = by_key(d.run_checks(fake_root(tmp_path, kprobes=True, lockdown=None)))
    assert c["kprobes"].state == d.OK and c["lockdown"].state == d.OK


def test_not_root_without_caps_cannot_record(tmp_path: Path) -> None:
    h = fake_root(tmp_path, kprobes=True, lockdown=None)
    h = d.Host(root=h.root, devdir=h.devdir, release=h.release, euid=1000)
    checks = d.run_checks(h)
    assert by_key(checks)["root"].state == d.NO
    assert d.layers(checks) == []
    last = d.render(checks, []).splitlines()[-1]
    assert last.startswith("record: cannot run (needs root,") and last.endswith("devices)")


def test_layers_from_checks() -> None:
    """Every registered layer's trace layers when every check passes (in registration
    order); a layer whose check fails is left out, the others stay."""
    from gputrace.record.layers import RECORDER_LAYERS

    ok = [d.Check(k, d.OK, "") for k in (*d.REQUIRED, "uprobes", "uvm-tools", "rm-client")]
    every = [layer for cls in RECORDER_LAYERS for layer in cls.records()]
    assert d.layers(ok) == every
    assert {"syscall", "api", "cpu_faults", "uvm_tools", "rm_query", "allocator"} <= set(every)
    no_tools = [c if c.key != "uvm-tools" else d.Check(c.key, d.NO, "") for c in ok]
    assert d.layers(no_tools) == [x for x in every if x != "uvm_tools"]
    no_uprobes = [c for c in ok if c.key != "uprobes"]
    assert d.layers(no_uprobes) == [layer for cls in RECORDER_LAYERS
                                    for layer, needs in cls.records().items()
                                    if "uprobes" not in needs]
    assert {"api", "allocator"}.isdisjoint(d.layers(no_uprobes))


def test_doctor_here_exits_by_whether_record_can_run(capsys: pytest.CaptureFixture[str],
                                                     tmp_path: Path) -> None:
    rc = main(["doctor", "--device-dir", str(tmp_path)])
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert [ln.split()[0] for ln in lines[:-1]] == [
        "root", "bcc", "kernel-headers", "tracefs", "hooks", "uprobes", "kprobes", "btf",
        "lockdown", "driver", "devices", "uvm-tools", "rm-client", "torch", "bpf-cache"]
    assert "no nvidiactl" in out
    assert rc == 1 and lines[-1].startswith("record: cannot run")


SKIP = standin.skip_reason()


@pytest.mark.live
@pytest.mark.skipif(SKIP is not None, reason=SKIP or "")
def test_doctor_against_the_standin(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with standin.mounted_driver(tmp_path, gpus=2) as dev:
        rc = main(["doctor", "--device-dir", str(dev)])
    out = capsys.readouterr().out
    c = {ln.split()[0]: ln.split()[1] for ln in out.splitlines()[:-1]}
    assert c["devices"] == c["uvm-tools"] == c["rm-client"] == "ok"
    assert "GPU 0, 1" in out
    if all(c[k] == "ok" for k in d.REQUIRED):
        assert rc == 0 and "uvm_tools, rm_query" in out.splitlines()[-1]
    else:
        assert rc == 1
