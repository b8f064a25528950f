"""The C event structs (probes/gputrace_events.h) and their numpy mirrors agree:
gcc prints every sizeof/offsetof, the test compares with the dtypes."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from gputrace.record import decode, incidents
from gputrace.record.api import decode as decode_cuda
from gputrace.record.cpu_faults import decode as decode_faults

HEADER = Path(__file__).resolve().parents[3] / "probes" / "gputrace_events.h"

STRUCTS = {
    "ioctl_event": decode.IOCTL_DTYPE,
    "mapping_event": decode.MAPPING_DTYPE,
    "proc_event": decode.PROC_DTYPE,
    "proc_start": decode.PROC_START_DTYPE,
    "gt_config": decode.CONFIG_DTYPE,
    "uvm_layout": decode.UVM_LAYOUT_DTYPE,
    # API layer
    "cuda_event": decode_cuda.CUDA_DTYPE,
    "cuda_pause": decode_cuda.CUDA_PAUSE_DTYPE,
    "cuda_config": decode_cuda.CUDA_CONFIG_DTYPE,
    "py_proc": decode_cuda.PY_PROC_DTYPE,
    # CPU faults on managed memory
    "fault_event": decode_faults.FAULT_DTYPE,
    "mblock_key": decode_faults.MBLOCK_KEY_DTYPE,
    "mblock": decode_faults.MBLOCK_DTYPE,
    # open/close/dup of NVIDIA fds (files table)
    "fd_event": decode.FD_DTYPE,
    # "no memory" failures sent at once (record/incidents.py)
    "oom_event": incidents.OOM_DTYPE,
}


def _c_layout(tmp_path: Path) -> dict[str, int]:
    lines = [
        "#include <stdio.h>",
        "#include <stddef.h>",
        f'#include "{HEADER}"',
        "int main(void) {",
    ]
    for struct, dt in STRUCTS.items():
        lines.append(f'printf("{struct} %zu\\n", sizeof(struct {struct}));')
        for name in dt.names or ():
            lines.append(f'printf("{struct}.{name} %zu\\n", offsetof(struct {struct}, {name}));')
    lines.append('printf("ioctl_batch %zu\\n", sizeof(struct ioctl_batch));')
    lines.append('printf("ioctl_batch.ev %zu\\n", offsetof(struct ioctl_batch, ev));')
    lines.append('printf("fault_batch %zu\\n", sizeof(struct fault_batch));')
    lines.append('printf("fault_batch.ev %zu\\n", offsetof(struct fault_batch, ev));')
    lines.append('printf("managed_proc %zu\\n", sizeof(struct managed_proc));')
    lines.append("return 0; }")
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run(["gcc", "-DGT_USERSPACE", "-Wall", "-Werror", "-o", str(exe), str(src)],
                   check=True, capture_output=True)  # fmt: skip
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return {k: int(v) for k, v in (ln.split() for ln in out.splitlines())}


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not installed")
def test_struct_layouts_match_numpy(tmp_path: Path) -> None:
    c = _c_layout(tmp_path)
    for struct, dt in STRUCTS.items():
        assert c[struct] == dt.itemsize, struct
        fields = dt.fields or {}
        for name in dt.names or ():
            assert c[f"{struct}.{name}"] == fields[name][1], f"{struct}.{name}"
    assert c["ioctl_batch.ev"] == decode.BATCH_HEADER
    assert (
        c["ioctl_batch"] == decode.BATCH_HEADER + decode.STAGE_EVENTS * decode.IOCTL_DTYPE.itemsize
    )
    assert c["fault_batch.ev"] == decode.BATCH_HEADER
    assert c["fault_batch"] == (
        decode.BATCH_HEADER + decode_faults.FAULT_STAGE_EVENTS * decode_faults.FAULT_DTYPE.itemsize
    )
    assert c["managed_proc"] == decode_faults.MANAGED_PROC_DTYPE.itemsize


def test_valid_bits_match_header() -> None:
    text = HEADER.read_text()
    for name, bit in decode.VALID_BITS.items():
        macro = "GT_V_" + ("UUID" if name == "gpu_uuid" else
                           "SIZE" if name == "size_bytes" else name.upper())  # fmt: skip
        assert f"#define {macro} (1u << {bit})" in text, macro


def test_decode_batches_roundtrip() -> None:
    ev = np.zeros(3, decode.IOCTL_DTYPE)
    ev["ts_ns"] = [30, 10, 20]
    ev["pid"] = ev["tid"] = 7
    ev["comm"] = b"work"
    ev["device"] = [1, 1, 3]
    ev["gpu_index"] = -1
    ev["nr"] = [0x2B, 0x29, 34]
    ev["size_bytes"] = [4096, 0, 0]
    ev["valid"] = [1 << 5 | 1, 1, 1]
    ev["status"] = [0x51, 0, 0]
    raw = b""
    for chunk in (ev[:2], ev[2:]):
        raw += len(chunk).to_bytes(4, "little") + b"\0" * 4 + chunk.tobytes()
    got = decode.ioctl_events_from_batches(raw)
    assert len(got) == 3
    b = decode.ioctls_batch(got).to_pydict()
    assert b["ts_ns"] == [10, 20, 30]
    assert b["name"] == ["RM_FREE", "UVM_FREE", "RM_ALLOC"]
    assert b["size_bytes"] == [None, None, 4096]
    assert b["status"] == [0, 0, 0x51]
    assert b["device"] == ["ctl", "uvm", "ctl"]
    assert b["gpu_index"] == [None, None, None]
    assert b["comm"] == ["work"] * 3


def test_cuda_functions_match_probe() -> None:
    """probes/cuda.bpf.c's GT_API3 lines are hooks.CUDA_FUNCS; GT_CV_* bits agree."""
    import re

    from gputrace.record import hooks

    text = (HEADER.parent / "cuda.bpf.c").read_text()
    lines = re.findall(r"^GT_API3\((\w+), (\d+), (S_\w+)\)$", text, re.M)
    assert lines == [(f.symbol, str(f.base), f.shape) for f in hooks.CUDA_FUNCS]
    header = HEADER.read_text()
    for name, bit in decode_cuda.CUDA_VALID_BITS.items():
        macro = "GT_CV_" + ("SIZE" if name == "size_bytes" else name.upper())
        assert f"#define {macro} (1u << {bit})" in header, macro


def test_fault_batches_decode() -> None:
    """CPU faults: batches in, `faults` rows out (read/write from error bit 1)."""
    ev = np.zeros(3, decode_faults.FAULT_DTYPE)
    ev["ts_ns"] = [30, 10, 20]
    ev["address"] = [0x300000200040, 0x300000000040, 0x3000003FF000]
    ev["error_code"] = [0x6, 0x4, 0x7]  # user|write, user read, user|write|present
    ev["pid"] = ev["tid"] = 9
    ev["comm"] = b"touch"
    raw = b"".join(len(c).to_bytes(4, "little") + b"\0" * 4 + c.tobytes()
                   for c in (ev[:1], ev[1:]))  # fmt: skip
    b = decode_faults.faults_batch(decode_faults.fault_events_from_batches(raw)).to_pydict()
    assert b["ts_ns"] == [10, 20, 30]
    assert b["access_type"] == ["read", "write", "write"]
    assert b["block_2m"] == [0x300000000000, 0x300000200000, 0x300000200000]
    assert b["source"] == ["cpu"] * 3 and b["fault_type"] == ["unknown"] * 3
    assert b["gpu_index"] == [None] * 3 and b["comm"] == ["touch"] * 3


def test_fd_constants_match_header() -> None:
    """GT_FD_* are schema.FD_OPS codes; GT_BUF_* index loader.BUFFERS; GT_NBUF counts them."""
    import re

    from gputrace import schema
    from gputrace.record import loader

    text = HEADER.read_text()
    ops = {int(v): k for k, v in re.findall(r"^#define GT_FD_(\w+) (\d+)", text, re.M)}
    assert {c: n.lower() for c, n in ops.items()} == schema.FD_OPS
    assert (decode.FD_OPEN, decode.FD_CLOSE, decode.FD_DUP, decode.FD_SEEN) == (1, 2, 3, 4)
    assert f"#define GT_FV_RET (1u << {decode.FV_RET.bit_length() - 1})" in text
    bufs = dict(re.findall(r"^#define GT_BUF_(\w+) (\d+)", text, re.M))
    assert sorted(int(v) for v in bufs.values()) == list(range(len(loader.BUFFERS)))
    assert f"#define GT_NBUF {len(loader.BUFFERS)}" in text
    assert loader.BUFFERS[int(bufs["FD"])] == "fd_events"


def test_files_batch_decode() -> None:
    """fd events in, `files` rows out: new_fd only for dups, ret only where valid."""
    ev = np.zeros(4, decode.FD_DTYPE)
    ev["ts_ns"] = [40, 10, 20, 30]
    ev["pid"] = ev["tid"] = 5
    ev["comm"] = b"wl"
    ev["op"] = [2, 1, 3, 2]  # close (implicit), open, dup, close
    ev["device"] = [1, 2, 1, 1]
    ev["gpu_index"] = [-1, 0, -1, -1]
    ev["fd"] = [9, 4, 3, 7]
    ev["new_fd"] = [-1, -1, 7, -1]
    ev["ret"] = [0, 4, 7, 0]
    ev["valid"] = [0, 1, 1, 1]
    b = decode.files_batch(ev).to_pydict()
    assert b["ts_ns"] == [10, 20, 30, 40]
    assert b["fd_op"] == ["open", "dup", "close", "close"]
    assert b["device"] == ["gpu", "ctl", "ctl", "ctl"]
    assert b["gpu_index"] == [0, None, None, None]
    assert b["new_fd"] == [None, 7, None, None]
    assert b["ret"] == [4, 7, 0, None]
    seen = decode.seen_events({(8, 3): (1, -1), (8, 4): (2, 1)}, 99, {8: "app"})
    s = decode.files_batch(seen).to_pydict()
    assert s["fd_op"] == ["seen", "seen"] and s["ts_ns"] == [99, 99]
    assert s["tid"] == [8, 8] and s["comm"] == ["app", "app"]
    assert s["fd"] == [3, 4] and s["gpu_index"] == [None, 1]
    assert s["ret"] == [None, None] and s["new_fd"] == [None, None]
