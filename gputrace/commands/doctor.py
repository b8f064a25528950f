"""`gputrace doctor`: what this host can record, and why not.

One line per item. The exit status answers "can `gputrace record` run here?":
0 when the syscall layer can be recorded (the layers that can are listed), 1
when it cannot. Nothing is changed on the host: tracefs is not mounted, no probe
is loaded; the RM client check opens and frees a client of its own.
"""

from __future__ import annotations

import gzip
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

OK, NO, WARN = "ok", "no", "warn"

CAP_SYS_ADMIN, CAP_SYS_PTRACE, CAP_PERFMON, CAP_BPF = 21, 19, 38, 39


@dataclass(frozen=True)
class Check:
    """One doctor line: what was checked, its state, and the evidence or the fix."""

    key: str
    state: str  # ok | no | warn
    detail: str


@dataclass(frozen=True)
class Host:
    """Where the checks look (a test points these at a fake root)."""

    root: Path = Path("/")
    devdir: str = "/dev"
    release: str = os.uname().release
    euid: int = -1  # -1: the real euid

    def p(self, path: str) -> Path:
        return self.root / path.lstrip("/")


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def _cap_eff(h: Host) -> int:
    status = _read(h.p("/proc/self/status")) or ""
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            try:
                return int(line.split()[1], 16)
            except (IndexError, ValueError):
                return 0
    return 0


def check_privileges(h: Host) -> Check:
    euid = os.geteuid() if h.euid < 0 else h.euid
    if euid == 0:
        return Check("root", OK, "running as root")
    caps = _cap_eff(h)
    have = [n for n, b in (("CAP_BPF", CAP_BPF), ("CAP_PERFMON", CAP_PERFMON),
                           ("CAP_SYS_PTRACE", CAP_SYS_PTRACE)) if caps >> b & 1]  # fmt: skip
    if {"CAP_BPF", "CAP_PERFMON"} <= set(have):
        return Check("root", OK, f"not root, but has {', '.join(have)}")
    return Check("root", NO, "not root and no CAP_BPF+CAP_PERFMON: run with sudo")


def check_bcc(h: Host) -> Check:
    if importlib.util.find_spec("bcc") is not None:
        return Check("bcc", OK, "bcc importable")
    if h.p("/usr/lib/python3/dist-packages/bcc").is_dir():
        return Check("bcc", OK, "bcc in /usr/lib/python3/dist-packages (python3-bpfcc)")
    return Check("bcc", NO, "bcc not found: apt-get install python3-bpfcc (Debian/Ubuntu) "
                 "or dnf install python3-bcc")  # fmt: skip


def check_headers(h: Host) -> Check:
    src = os.environ.get("BCC_KERNEL_SOURCE")
    if src and Path(src).is_dir():
        return Check("kernel-headers", OK, f"BCC_KERNEL_SOURCE={src}")
    build = h.p(f"/lib/modules/{h.release}/build")
    if build.exists():
        return Check("kernel-headers", OK, f"/lib/modules/{h.release}/build")
    if h.p("/sys/kernel/kheaders.tar.xz").exists():
        return Check("kernel-headers", OK, "/sys/kernel/kheaders.tar.xz (CONFIG_IKHEADERS)")
    return Check("kernel-headers", NO, f"no /lib/modules/{h.release}/build: install "
                 f"linux-headers-{h.release} or set BCC_KERNEL_SOURCE")  # fmt: skip


def _mounts(h: Host) -> list[tuple[str, str]]:
    out = []
    for line in (_read(h.p("/proc/mounts")) or "").splitlines():
        parts = line.split()
        if len(parts) >= 3:
            out.append((parts[1], parts[2]))
    return out


def tracefs_dir(h: Host) -> Path | None:
    for mnt, fs in _mounts(h):
        if fs == "tracefs":
            return h.p(mnt)
    return None


def check_tracefs(h: Host) -> Check:
    d = tracefs_dir(h)
    if d is not None:
        return Check("tracefs", OK, f"mounted at /{d.relative_to(h.root).as_posix()}")
    if "tracefs" in (_read(h.p("/proc/filesystems")) or ""):
        return Check("tracefs", OK, "not mounted; record mounts it (kernel supports tracefs)")
    return Check("tracefs", NO, "kernel has no tracefs")


def check_hooks(h: Host) -> Check:
    """The recorder's tracepoints (record/hooks.py `HOOKS`, the one table of them), each
    named when this kernel lacks it: a required one stops `record`, an optional one is
    compiled out."""
    import platform

    from gputrace.record import hooks

    d = tracefs_dir(h)
    if d is None or not (d / "events").is_dir():
        return Check("hooks", WARN, f"{len(hooks.HOOKS)} tracepoints not checked: tracefs "
                                    "events not readable here (record mounts tracefs)")
    here = [x for x in hooks.HOOKS if x.arch is None or x.arch == platform.machine()]
    missing = [x for x in here if not hooks.available(d, x)]
    required = [x.name for x in missing if x.required]
    if required:
        return Check("hooks", NO, "required tracepoints missing (record stops): "
                     + ", ".join(required))
    if missing:
        return Check("hooks", WARN, f"{len(here) - len(missing)} of {len(here)} tracepoints; "
                     "optional ones missing (compiled out): "
                     + ", ".join(x.name for x in missing))
    return Check("hooks", OK, f"all {len(here)} tracepoints present")


def kernel_config(h: Host) -> dict[str, str] | None:
    """CONFIG_* of the running kernel from /proc/config.gz or /boot/config-RELEASE."""
    text = None
    gz = h.p("/proc/config.gz")
    if gz.exists():
        try:
            text = gzip.decompress(gz.read_bytes()).decode(errors="replace")
        except (OSError, EOFError):
            text = None
    if text is None:
        text = _read(h.p(f"/boot/config-{h.release}"))
    if text is None:
        return None
    cfg = {}
    for line in text.splitlines():
        k, sep, v = line.partition("=")
        if sep and k.startswith("CONFIG_"):
            cfg[k] = v
    return cfg


def _kallsyms_has(h: Host, name: str) -> bool:
    try:
        with h.p("/proc/kallsyms").open(errors="replace") as f:
            return any(line.rstrip().endswith(f" {name}") for line in f)
    except OSError:
        return False


def check_config(h: Host, key: str, what: str, symbol: str, needed_by: str) -> Check:
    cfg = kernel_config(h)
    if cfg is not None:
        on = cfg.get(key) in ("y", "m")
        return Check(what, OK if on else WARN,
                     f"{key}={'y' if on else 'not set'} ({needed_by})")  # fmt: skip
    if _kallsyms_has(h, symbol):
        return Check(what, OK, f"{symbol} in kallsyms ({needed_by})")
    return Check(what, WARN, f"unknown: no kernel config, {symbol} not in kallsyms ({needed_by})")


def check_btf(h: Host) -> Check:
    btf = h.p("/sys/kernel/btf")
    mods = sorted(p.name for p in btf.glob("nvidia*")) if btf.is_dir() else []
    vml = (btf / "vmlinux").exists()
    if mods:
        return Check("btf", OK, f"vmlinux {'yes' if vml else 'no'}; modules {', '.join(mods)}")
    return Check("btf", WARN, f"vmlinux {'yes' if vml else 'no'}; no nvidia module BTF "
                 "(driver hooks need it; the driver layer does not)")  # fmt: skip


def check_lockdown(h: Host) -> Check:
    text = _read(h.p("/sys/kernel/security/lockdown"))
    if text is None:
        return Check("lockdown", OK, "no lockdown file (not locked down)")
    mode = next((w.strip("[]") for w in text.split() if w.startswith("[")), "unknown")
    if mode == "none":
        return Check("lockdown", OK, "none")
    return Check("lockdown", WARN, f"{mode}: kprobes, fentry and tracefs function filters "
                 "may be refused; the syscall, api and driver layers still work")  # fmt: skip


def driver_version(h: Host) -> tuple[str | None, str]:
    """(version, where it was read) of the loaded NVIDIA driver."""
    from gputrace.record.driver_version import detect_version

    for src in ("/sys/module/nvidia_uvm/version", "/sys/module/nvidia/version",
                "/proc/driver/nvidia/version"):  # fmt: skip
        if h.p(src).exists():
            return detect_version(str(h.root)), src
    return None, ""


def check_driver(h: Host) -> Check:
    mods = [m for m in ("nvidia", "nvidia_uvm") if h.p(f"/sys/module/{m}").is_dir()]
    ver, src = driver_version(h)
    if ver is None:
        return Check("driver", NO, "no NVIDIA driver loaded (no /sys/module/nvidia_uvm, "
                     "/proc/driver/nvidia/version)")  # fmt: skip
    return Check("driver", OK, f"{ver} (from {src}); modules: {', '.join(mods) or 'none'}")


def check_devices(h: Host) -> Check:
    d = Path(h.devdir)
    if not d.is_dir():
        return Check("devices", NO, f"{h.devdir}: no such directory")
    names = sorted(n for n in os.listdir(d) if n.startswith("nvidia"))
    if "nvidiactl" not in names:
        return Check("devices", NO, f"no nvidiactl in {h.devdir}")
    return Check("devices", OK, f"{h.devdir}: {', '.join(names)}")


def check_tools(h: Host) -> Check:
    path = os.path.join(h.devdir, "nvidia-uvm-tools")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as e:
        return Check("uvm-tools", NO, f"open {path}: {e.strerror} (no GPU faults or "
                     "migrations)")  # fmt: skip
    os.close(fd)
    return Check("uvm-tools", OK, f"{path} opens read-write (UVM tools trackers)")


def check_rm(h: Host) -> Check:
    from gputrace.record.driver_version import LATEST, parse_version
    from gputrace.record.rm_query import client as rm_client

    ver, _ = driver_version(h)
    try:
        c = rm_client.RmClient.open(h.devdir, parse_version(ver or LATEST), str(h.root))
    except rm_client.RmError as e:
        return Check("rm-client", NO, f"{e} (no gpu_memory)")
    try:
        gpus = ", ".join(str(g.gpu_index) for g in c.gpus)
        return Check("rm-client", OK, f"root client, device and subdevice of GPU {gpus}")
    finally:
        c.close()


def check_torch(h: Host) -> Check:
    """The libc10_cuda.so files running processes map: does the torch_allocator layer
    know their PyTorch release (else it skips them, never guessing)?"""
    from gputrace.record.torch_allocator import symbols

    proc = str(h.p("/proc"))
    found = symbols.verdicts(symbols.mapped_libraries(proc), proc)
    unknown = [(p, why) for p, why in found if why is not None]
    if unknown:
        path, why = unknown[0]
        more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
        return Check("torch", WARN, f"{path}: {why}; the torch_allocator layer skips "
                     f"it{more}")  # fmt: skip
    if found:
        return Check("torch", OK, f"{len(found)} libc10_cuda.so mapped, each of a known "
                     "release (torch_allocator layer)")  # fmt: skip
    return Check("torch", OK, "no process maps a libc10_cuda.so now (torch_allocator "
                 "layer: found when one does)")  # fmt: skip


def check_bpf_cache(h: Host) -> Check:
    """Whether the start-up reuses compiled BPF programs (record/bpf_cache.py)."""
    from gputrace.record import bpf_cache
    from gputrace.render.safe import printable

    st = bpf_cache.state()
    if st["dir"] is None:
        return Check("bpf-cache", WARN, f"{st['state']}: each recording compiles its BPF "
                     "programs (seconds of clang)")  # fmt: skip
    where = printable(str(st["dir"]))
    if st["state"] != "on":
        ok = st["state"].startswith("empty")
        return Check("bpf-cache", OK if ok else WARN, f"{where}: {st['state']}"
                     + ("" if ok else "; each recording compiles its BPF programs"))  # fmt: skip
    return Check("bpf-cache", OK, f"{where}: {st['entries']} programs "
                 f"({st['bytes'] >> 10} KiB), {st['current']} for this kernel and "
                 f"bcc {printable(st['bcc'])}")  # fmt: skip


CHECKS: tuple[Callable[[Host], Check], ...] = (
    check_privileges, check_bcc, check_headers, check_tracefs, check_hooks,
    lambda h: check_config(h, "CONFIG_UPROBE_EVENTS", "uprobes", "uprobe_register",
                           "api layer"),
    lambda h: check_config(h, "CONFIG_KPROBES", "kprobes", "register_kprobe",
                           "in-kernel driver hooks"),
    check_btf, check_lockdown, check_driver, check_devices, check_tools, check_rm,
    check_torch,
    check_bpf_cache,
)  # fmt: skip


def run_checks(h: Host) -> list[Check]:
    out = []
    for fn in CHECKS:
        try:
            out.append(fn(h))
        except Exception as e:  # one broken probe must not hide the others
            out.append(Check(getattr(fn, "__name__", "check"), WARN, f"check failed: {e}"))
    return out


REQUIRED = ("root", "bcc", "kernel-headers", "tracefs", "devices")
"""Without these `record` cannot record anything useful (the device files are what
every layer watches: a host with no driver needs --device-dir of a stand-in)."""


def layers(checks: list[Check]) -> list[str]:
    """The trace layers `record` could record given these checks: each recorder layer's
    (`layers.RECORDER_LAYERS`, in order) whose checks pass (`Layer.RECORDS`)."""
    from gputrace.record.layers import RECORDER_LAYERS

    st = {c.key: c.state for c in checks}
    if not all(st.get(k) == OK for k in REQUIRED):
        return []
    return [layer for cls in RECORDER_LAYERS for layer, needs in cls.records().items()
            if all(st.get(k) == OK for k in needs)]


def render(checks: list[Check], can: list[str]) -> str:
    width = max(len(c.key) for c in checks)
    lines = [f"{c.key:<{width}}  {c.state:<4}  {c.detail}" for c in checks]
    if can:
        lines.append(f"record: can run; layers: {', '.join(can)}")
    else:
        missing = [c.key for c in checks
                   if c.key in REQUIRED and c.state != OK]
        lines.append(f"record: cannot run (needs {', '.join(missing)})")
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    @app.command()
    def doctor(
        device_dir: Annotated[
            str, typer.Option("--device-dir", help="Folder holding the NVIDIA device files.")
        ] = "/dev",
    ) -> None:
        """Say what this host can record, and why not (exit 0 when record can run)."""
        checks = run_checks(Host(devdir=device_dir))
        can = layers(checks)
        typer.echo(render(checks, can))
        if not can:
            raise typer.Exit(1)
