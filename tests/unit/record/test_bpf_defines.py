"""Every numeric `#define GT_*` of probes/ against the one Python place that
holds the same fact (schema enums, decoders, loader, driver tables). A define
missing from the table below fails the test: a new constant must say where its
Python twin is, or why it has none. No kernel, bcc or root needed."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from gputrace import nvabi, schema
from gputrace.record import decode, loader
from gputrace.record import driver_version as driver
from gputrace.record.api import decode as decode_cuda
from gputrace.record.api import libcuda as cuda
from gputrace.record.cpu_faults import decode as decode_faults
from gputrace.record.torch_allocator import decode as decode_torch
from gputrace.record.torch_allocator import layer as torch_layer
from gputrace.record.unwind import cfi as unwind_cfi
from gputrace.record.unwind import tables as unwind_tables

PROBES = Path(__file__).resolve().parents[3] / "probes"
_DEFINE = re.compile(r"^\s*#\s*define\s+(GT_[A-Z0-9_]+)\s+(.+?)\s*(?:/\*.*)?$")
_VALUE = re.compile(r"^\(?\s*(0x[0-9a-fA-F]+|\d+)[uUlL]*\s*(?:<<\s*(\d+))?\s*\)?[uUlL]*$")
UNISTD = Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")


def defines() -> dict[str, tuple[int, str]]:
    """name -> (value, file) of every GT_* define with an integer value; a name
    defined twice must have one value."""
    out: dict[str, tuple[int, str]] = {}
    for f in sorted([*PROBES.glob("*.h"), *PROBES.glob("*.c")]):
        for line in f.read_text().splitlines():
            m = _DEFINE.match(line)
            if not m:
                continue
            v = _VALUE.match(m.group(2))
            if not v:
                continue  # function-like or expression macros (GT_API, guards)
            value = int(v.group(1), 0) << int(v.group(2) or 0)
            name = m.group(1)
            assert out.get(name, (value, ""))[0] == value, f"{name} differs in {f.name}"
            out[name] = (value, f.name)
    return out


def _enum_code(enum: dict[int, str], label: str) -> int:
    return {v: k for k, v in enum.items()}[label]


def python_value(name: str) -> int | None:
    """The Python twin of a define; None for C-only ones (listed in C_ONLY)."""
    fixed: dict[str, int] = {
        "GT_STAGE_EVENTS": decode.STAGE_EVENTS,
        "GT_FAULT_STAGE": decode_faults.FAULT_STAGE_EVENTS,
        "GT_BIG_RANGES": decode_faults.BIG_RANGES,
        "GT_NOFF": driver.NOFF,
        "GT_UVM_SLOT_INITIALIZE": driver.SLOT_INITIALIZE,
        "GT_UVM_SLOT_DEINITIALIZE": driver.SLOT_DEINITIALIZE,
        "GT_UVM_SPAN": driver.SPAN_MAX,
        "GT_FLUSH_CMD": loader.FLUSH_CMD,
        "GT_IOCTL_RB_PAGES": loader.IOCTL_RB_PAGES,
        "GT_FAULT_RB_PAGES": loader.FAULT_RB_PAGES,
        "GT_CUDA_RB_PAGES": cuda.CUDA_RB_PAGES,
        "GT_CUDA_STACK_DEPTH": cuda.STACK_DEPTH,
        "GT_TORCH_STACKS": torch_layer.STACKS["python"],  # --torch-stacks' default
        "GT_TORCH_RB_PAGES": torch_layer.RB_PAGES,
        "GT_UNWIND_ROWS": unwind_tables.ROWS,
        "GT_UNWIND_MAPS": unwind_tables.MAPS,
        "GT_UNWIND_FRAMES": unwind_tables.FRAMES,
        "GT_UNWIND_STEP": unwind_tables.STEP,
        "GT_UNWIND_TAIL_STEP": unwind_tables.TAIL_STEP,
        "GT_UNWIND_TAIL_BACK": unwind_tables.TAIL_BACK,
        "GT_UNWIND_SEARCH": unwind_tables.TABLE_ROWS.bit_length() - 1,
        "GT_UNWIND_STOP": unwind_cfi.STOP,
        "GT_UNWIND_CFA_RSP": unwind_cfi.CFA_RSP,
        "GT_UNWIND_CFA_RBP": unwind_cfi.CFA_RBP,
        "GT_PAUSE_LOAD": cuda.PAUSE_LOAD,
        "GT_PAUSE_FIRST": cuda.PAUSE_FIRST,
        "GT_PAUSE_PY": cuda.PAUSE_PY,
        "GT_FV_RET": decode.FV_RET,
        "GT_NBUF": len(loader.BUFFERS),
        "GT_FS_N": len(loader.FAULT_STATS),
        "GT_SIGSTOP": int(signal.SIGSTOP),
        "GT_PROC_FORK": decode.PROC_FORK,
        "GT_PROC_EXEC": decode.PROC_EXEC,
        "GT_PROC_EXIT": decode.PROC_EXIT,
        "GT_PROC_SEEN": decode.PROC_SEEN,
        "GT_PROC_UVM_INIT": decode.PROC_UVM_INIT,
        "GT_NV_ERR_NO_MEMORY": nvabi.NV_ERR_NO_MEMORY,
        "GT_CUDA_ERROR_OUT_OF_MEMORY": nvabi.CUDA_ERROR_OUT_OF_MEMORY,
        # the C default covers the largest pid_max, which the loader passes when it reads so
        "GT_TGID_WORDS": loader.tgid_words(Path("/nonexistent")),
        # the C defaults are the newest driver's offsets (the loader passes the resolved ones)
        **{k: v for k, v in driver.resolve(driver.LATEST).defines.items()},
    }
    if name in fixed:
        return fixed[name]
    if name.startswith(("GT_ESC_", "GT_CLASS_")) or name in ("GT_UVM_INITIALIZE",
                                                              "GT_UVM_DEINITIALIZE"):
        value = getattr(nvabi, name.removeprefix("GT_CLASS_").removeprefix("GT_"))
        assert isinstance(value, int)
        return value
    families: list[tuple[str, dict[int, str], dict[str, str]]] = [
        ("GT_DEV_", schema.DEVICE_KINDS, {"UVM_TOOLS": "uvm-tools"}),
        ("GT_MAP_", schema.MAPPING_OPS, {}),
        ("GT_FD_", schema.FD_OPS, {}),
    ]
    for prefix, enum, spelled in families:
        rest = name.removeprefix(prefix)
        if (rest != name and rest in spelled) or rest.lower() in enum.values():
            return _enum_code(enum, spelled.get(rest, rest.lower()))
    if name.startswith("GT_V_"):
        col = {"SIZE": "size_bytes", "UUID": "gpu_uuid"}.get(name[5:], name[5:].lower())
        return 1 << decode.VALID_BITS[col]
    if name.startswith("GT_CV_"):
        col = {"SIZE": "size_bytes"}.get(name[6:], name[6:].lower())
        return 1 << decode_cuda.CUDA_VALID_BITS[col]
    if name.startswith("GT_TORCH_"):
        return {v: k for k, v in decode_torch.KINDS.items()}[name[9:].lower()]
    if name.startswith("GT_BUF_"):
        return [b.removesuffix("_events").upper() for b in loader.BUFFERS].index(name[7:])
    if name.startswith("GT_FS_"):
        names = {"untracked_blocks": "BLOCKS_OVERFLOW", "untracked_ranges": "RANGES_OVERFLOW"}
        return [names[n] for n in loader.FAULT_STATS].index(name[6:])
    if name.startswith("GT_TAIL_"):
        return [t.removeprefix("gt_exit_").upper() for t in loader.TP_BTF_TAILS].index(name[8:])
    return None


# C-only constants and why they have no Python twin
C_ONLY = {
    "GT_PREFIX_MAX": "path buffer of the open probe; loader.configure caps the prefix below it",
    "GT_UVM_SLOTS": "size of the uvm_layouts map; driver slots must fit (checked below)",
    "GT_FD_SCAN": "fds copied at fork and dropped at exit, a BPF loop bound",
    "GT_SMALL_BLOCKS": "a BPF loop bound of the managed-range editor",
    "GT_MANAGED_BLOCKS": "capacity of the managed_blocks map",
    "GT_GEN_BPF_MASK": "generations the probe hands out (user space sets bit 31)",
    "GT_MAP_FIXED": "Linux MAP_FIXED",
    "GT_USER_CS": "x86-64 __USER_CS: a native 64-bit syscall",
    "GT_FD_RB_PAGES": "fd_events ring buffer, sized in C only",
    "GT_CUDA_STACKS": "capacity of the API layer's stack map",
    "GT_CUDA_STACK_SPAN": "how far above the user sp the stack walk follows frame pointers",
    "GT_CUDA_STACK_PROBES": "keys tried when another stack holds a stack's hash",
    "GT_CUDA_STACK_CHUNK": "words of user stack one read of the stack walk copies",
    "GT_CUDA_STACK_FIRST": "words the first read of a stack walk copies",
    "GT_PATH_MAX": "path buffer of the API layer's open probe",
    "GT_COMM_TTL_NS": "how long a thread's kept name serves before it is read again",
    "GT_PY_DEPTH": "Python frames the probe keeps per stack (python_stacks reads them all)",
    "GT_PY_STACKS": "capacity of the Python stack map",
    "GT_PY_INTERPS": "interpreters the probe looks at, a BPF loop bound",
    "GT_PY_THREADS": "thread states looked at per interpreter, a BPF loop bound",
    "GT_PY_BLOCK": "bytes of one thread state or frame read, a buffer size",
    "GT_PY_PAGE": "the page a frame read does not cross",
    "GT_PY_WINDOW": "the Python walk's read buffer",
    "GT_PY_NONE": "an offset the layout lacks (no such field in this CPython)",
    "GT_UNWIND_WALKING": "a whole-stack walk's state, between its tail calls",
    "GT_UNWIND_DONE": "a whole-stack walk's state, between its tail calls",
    "GT_PY_CSTACK": "FRAME_OWNED_BY_CSTACK of CPython 3.12+, compared in the probe only",
}


def test_every_define_has_a_python_twin_or_a_reason() -> None:
    found = defines()
    assert len(found) > 60  # the parser works
    for name, (value, where) in sorted(found.items()):
        if name.startswith("GT_NR_"):
            continue  # syscall numbers: test_syscall_numbers
        py = python_value(name)
        if py is None:
            assert name in C_ONLY, f"{name} ({where}) has no Python twin and no reason in C_ONLY"
            continue
        assert py == value, f"{name} = {value:#x} in {where}, {py:#x} in Python"


def test_c_only_limits_hold() -> None:
    found = defines()
    assert found["GT_PREFIX_MAX"][0] - 32 >= 200  # loader.configure accepts 200 bytes
    assert found["GT_UVM_SLOTS"][0] > driver.SLOT_DEINITIALIZE
    assert set(C_ONLY) <= set(found), "C_ONLY names a define that no longer exists"


@pytest.mark.skipif(not UNISTD.exists(), reason="no x86-64 asm/unistd_64.h")
def test_syscall_numbers() -> None:
    """The tp_btf dispatcher's numbers are the x86-64 ABI's."""
    nr = dict(re.findall(r"#define __NR_(\w+) (\d+)", UNISTD.read_text()))
    found = {n: v for n, (v, _f) in defines().items() if n.startswith("GT_NR_")}
    assert found
    for name, value in found.items():
        assert int(nr[name.removeprefix("GT_NR_").lower()]) == value, name
