"""Compiles and loads BPF programs: bcc's compile with its output kept off the
terminal, and the BTF raw tracepoint (tp_btf) programs, which bcc 0.26 cannot
load, handed to the bpf syscall here. bcc itself comes from loader.import_bcc.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
import threading
from pathlib import Path
from typing import Any

from gputrace.errors import GputraceError
from gputrace.record import bpf_cache, bpf_object

_BPF_PROG_LOAD = 5
_PROG_TYPE_TRACING = 26
_ATTACH_TRACE_RAW_TP = 23


class _ProgLoadAttr(ctypes.Structure):
    """The BPF_PROG_LOAD part of union bpf_attr, up to attach_btf_id."""

    _fields_ = [
        ("prog_type", ctypes.c_uint32), ("insn_cnt", ctypes.c_uint32),
        ("insns", ctypes.c_uint64), ("license", ctypes.c_uint64),
        ("log_level", ctypes.c_uint32), ("log_size", ctypes.c_uint32),
        ("log_buf", ctypes.c_uint64), ("kern_version", ctypes.c_uint32),
        ("prog_flags", ctypes.c_uint32), ("prog_name", ctypes.c_char * 16),
        ("prog_ifindex", ctypes.c_uint32), ("expected_attach_type", ctypes.c_uint32),
        ("prog_btf_fd", ctypes.c_uint32), ("func_info_rec_size", ctypes.c_uint32),
        ("func_info", ctypes.c_uint64), ("func_info_cnt", ctypes.c_uint32),
        ("line_info_rec_size", ctypes.c_uint32), ("line_info", ctypes.c_uint64),
        ("line_info_cnt", ctypes.c_uint32), ("attach_btf_id", ctypes.c_uint32),
    ]  # fmt: skip


def load_tp_btf(bpf: Any, func: str, tracepoint: str) -> int:
    """Load bcc's compiled `func` as a BTF raw tracepoint program for
    `tracepoint`; returns its fd. bcc 0.26 cannot load this type itself (it
    derives the attach type from the function name), so the already relocated
    instructions go to the bpf syscall here."""
    from bcc import libbcc

    lib = libbcc.lib
    find = lib.libbpf_find_vmlinux_btf_id
    find.argtypes, find.restype = [ctypes.c_char_p, ctypes.c_int], ctypes.c_int
    btf_id = find(tracepoint.encode(), _ATTACH_TRACE_RAW_TP)
    if btf_id < 0:
        raise GputraceError(f"tp_btf/{tracepoint}: not in the kernel's BTF")
    name = func.encode()
    if hasattr(bpf, "instructions"):  # a cached program (bpf_object): no bcc module
        start, size = bpf.instructions(func)
    else:
        start = lib.bpf_function_start(bpf.module, name)
        size = lib.bpf_function_size(bpf.module, name)
    if not start or not size:
        raise GputraceError(f"tp_btf/{tracepoint}: {func} was not compiled")
    lic = ctypes.create_string_buffer(b"GPL")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    nr_bpf = 321 if platform.machine() == "x86_64" else 280

    def load(log: Any) -> int:
        attr = _ProgLoadAttr(
            prog_type=_PROG_TYPE_TRACING, insn_cnt=size // 8, insns=start,
            license=ctypes.addressof(lic), prog_name=name[:15],
            expected_attach_type=_ATTACH_TRACE_RAW_TP, attach_btf_id=btf_id,
        )  # fmt: skip
        if log is not None:
            attr.log_level, attr.log_size, attr.log_buf = 1, len(log), ctypes.addressof(log)
        size_of = ctypes.c_uint(ctypes.sizeof(attr))
        cmd = ctypes.c_int(_BPF_PROG_LOAD)
        return int(libc.syscall(ctypes.c_long(nr_bpf), cmd, ctypes.byref(attr), size_of))

    fd = load(None)
    if fd < 0:
        err = os.strerror(ctypes.get_errno())
        log = ctypes.create_string_buffer(1 << 24)  # again, for the verifier's last words
        load(log)
        last = [ln for ln in log.value.decode(errors="replace").splitlines() if ln.strip()]
        raise GputraceError(f"tp_btf/{tracepoint}: {func} refused: {err}"
                            + (f" ({last[-1]})" if last else ""))  # fmt: skip
    return fd


def attach_tp_btf(fd: int, tracepoint: str) -> int:
    """Attach a loaded tp_btf program; returns the link fd."""
    from bcc import libbcc

    link = int(libbcc.lib.bpf_attach_kfunc(fd))  # BPF_RAW_TRACEPOINT_OPEN, no name
    if link < 0:
        raise GputraceError(f"tp_btf/{tracepoint}: attach refused")
    return link


RENAME_TRACEPOINT = "task_rename"


def keep_names(bpf: Any, func: str) -> tuple[list[int], str]:
    """Load and attach `func` on tp_btf/task_rename, which keeps the names
    threads hold in a layer's per-thread storage (probes/comm_cache.bpf.h).
    Returns its program and link fds (none when it could not run: the layer
    then reads the thread's name at every event, as it did before) and the
    manifest's `comm_cache` word: "tp_btf task_rename", or "off: <why>"."""
    try:
        fd = load_tp_btf(bpf, func, RENAME_TRACEPOINT)
    except GputraceError as e:
        return [], f"off: {e}"
    try:
        return [fd, attach_tp_btf(fd, RENAME_TRACEPOINT)], f"tp_btf {RENAME_TRACEPOINT}"
    except GputraceError as e:
        os.close(fd)
        return [], f"off: {e}"


def check_headers() -> None:
    """bcc compiles against the running kernel's headers; say so clearly if absent."""
    rel = os.uname().release
    build = Path("/lib/modules") / rel / "build"
    if build.exists() or Path("/sys/kernel/kheaders.tar.xz").exists():
        return
    raise GputraceError(
        f"kernel headers for {rel} not found (/lib/modules/{rel}/build): install "
        f"linux-headers-{rel} (Debian/Ubuntu) or kernel-devel (RHEL), "
        "or run scripts/setup-record.sh"
    )


def load_bpf(bcc: Any, text: str, flags: list[str], what: str) -> Any:
    """A loaded bcc program: from the BPF object cache when it holds the program
    (bpf_cache.py; compiled into it now in a child process if not), else compiled
    here by bcc. clang's and the verifier's output stay off the terminal: on
    failure it is saved to a file the one-line error names."""
    d = bpf_cache.cache_dir() if bpf_cache.cacheable(flags) else None
    why = "not cacheable" if not bpf_cache.cacheable(flags) else "cache off"
    if d is not None:
        k = bpf_cache.key(text, flags)
        entry = bpf_cache.read(d, k)
        if entry is None:
            bpf_cache.compile_entries(d, [(text, flags, what)])
            entry = bpf_cache.read(d, k)
        how = "compiled (cached now)" if k in bpf_cache.fresh else "cache"
        if entry is not None:
            try:
                obj = bpf_object.load(bcc, entry)
                bpf_cache.used[what] = how
                return obj
            except Exception as e:  # bcc's own load below says it again if it is real
                why = f"cached object refused: {str(e).splitlines()[0] if str(e) else e!r}"
    bpf_cache.used[what] = f"compiled ({why})"
    return _quiet(what, lambda: bcc.BPF(text=text.encode(), cflags=[*flags, "-w"]))


def _quiet(what: str, make: Any) -> Any:
    """`make()` with stderr in a file; its text saved when make raises. One at a
    time: fd 2 is the process's (layers may load from two threads)."""
    import tempfile

    with _STDERR:
        return _quiet_locked(what, make, tempfile)


_STDERR = threading.Lock()


def _quiet_locked(what: str, make: Any, tempfile: Any) -> Any:
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 2)
        try:
            return make()
        except Exception as e:
            os.dup2(saved, 2)
            log.seek(0)
            fd, path = tempfile.mkstemp(prefix=f"gputrace-{what}-", suffix=".log")
            with os.fdopen(fd, "wb") as out:
                out.write(log.read())
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise GputraceError(
                f"loading the {what} BPF programs failed: {first} (compiler and verifier "
                f"output in {path})"
            ) from None
        finally:
            os.dup2(saved, 2)
            os.close(saved)
