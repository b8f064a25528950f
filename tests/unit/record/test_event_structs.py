"""The probes' C structs and their numpy mirrors agree, for every layer: each mirror is
registered where it is defined (gputrace/record/structs.py), gcc compiles each header
named and prints every sizeof/offsetof, the test compares with the dtypes. A struct
dtype in gputrace/record/ that is not registered, or a layer's buffer whose record is
not a registered mirror, fails here too."""

from __future__ import annotations

import importlib
import pkgutil
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import gputrace.record
from gputrace.record import decode
from gputrace.record.api import decode as decode_cuda
from gputrace.record.cpu_faults import decode as decode_faults
from gputrace.record.structs import MIRRORS, PROBES, Mirror

HEADER = PROBES / "gputrace_events.h"
NEEDS_GCC = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not installed")


def _record_modules() -> list[Any]:
    """Every module of gputrace/record (importing them registers every mirror)."""
    return [importlib.import_module(m.name) for m in pkgutil.walk_packages(
        gputrace.record.__path__, "gputrace.record.")]


MODULES = _record_modules()


def _c_layout(tmp_path: Path, header: Path, mirrors: Iterable[Mirror],
              extra: Iterable[str] = ()) -> dict[str, int]:
    """sizeof and offsetof of each mirrored struct and field, as gcc lays out `header`."""
    lines = ["#include <stdio.h>", "#include <stddef.h>", f'#include "{header}"',
             "int main(void) {"]
    for m in mirrors:
        lines.append(f'printf("{m.struct} %zu\\n", sizeof(struct {m.struct}));')
        for name in m.dtype.names or ():
            lines.append(f'printf("{m.struct}.{name} %zu\\n", '
                         f'offsetof(struct {m.struct}, {name}));')
    lines += [*extra, "return 0; }"]
    src = tmp_path / f"{header.stem}.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / header.stem
    subprocess.run(["gcc", "-DGT_USERSPACE", "-Wall", "-Werror", "-o", str(exe), str(src)],
                   check=True, capture_output=True)  # fmt: skip
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return {k: int(v) for k, v in (ln.split() for ln in out.splitlines())}


def _disagreements(c: dict[str, int], mirrors: Iterable[Mirror]) -> list[str]:
    """Where the C layout and the mirrors differ (size or a field's offset)."""
    bad = []
    for m in mirrors:
        if c[m.struct] != m.dtype.itemsize:
            bad.append(f"sizeof(struct {m.struct}) {c[m.struct]} != {m.dtype.itemsize}")
        fields = m.dtype.fields or {}
        for name in m.dtype.names or ():
            if c[f"{m.struct}.{name}"] != fields[name][1]:
                bad.append(f"{m.struct}.{name} at {c[f'{m.struct}.{name}']} != "
                           f"{fields[name][1]}")
    return bad


BATCHES = [
    'printf("ioctl_batch %zu\\n", sizeof(struct ioctl_batch));',
    'printf("ioctl_batch.ev %zu\\n", offsetof(struct ioctl_batch, ev));',
    'printf("fault_batch %zu\\n", sizeof(struct fault_batch));',
    'printf("fault_batch.ev %zu\\n", offsetof(struct fault_batch, ev));',
]


@NEEDS_GCC
@pytest.mark.parametrize("header", sorted({m.header for m in MIRRORS.values()}))
def test_struct_layouts_match_numpy(tmp_path: Path, header: str) -> None:
    """Every registered mirror of `header`, field by field."""
    mirrors = [m for m in MIRRORS.values() if m.header == header]
    extra = BATCHES if header == HEADER.name else []
    c = _c_layout(tmp_path, PROBES / header, mirrors, extra)
    assert _disagreements(c, mirrors) == []
    if header == HEADER.name:
        assert c["ioctl_batch.ev"] == decode.BATCH_HEADER
        assert c["ioctl_batch"] == (decode.BATCH_HEADER
                                    + decode.STAGE_EVENTS * decode.IOCTL_DTYPE.itemsize)
        assert c["fault_batch.ev"] == decode.BATCH_HEADER
        assert c["fault_batch"] == (decode.BATCH_HEADER + decode_faults.FAULT_STAGE_EVENTS
                                    * decode_faults.FAULT_DTYPE.itemsize)


@NEEDS_GCC
def test_a_wrong_mirror_is_caught(tmp_path: Path) -> None:
    """The comparison fails on a mirror one field off (so the test above can fail)."""
    good = MIRRORS["proc_start"]
    fields = good.dtype.fields or {}
    assert next(iter(fields)) == "fork_ns"  # a u64 made a u32: every later field moves
    wrong = np.dtype([("fork_ns", "<u4"), *[(n, f[0]) for n, f in list(fields.items())[1:]]])
    bad = Mirror(good.header, good.struct, wrong)
    c = _c_layout(tmp_path, PROBES / good.header, [bad])
    assert any("proc_start" in d for d in _disagreements(c, [bad]))


def test_every_struct_dtype_is_a_registered_mirror() -> None:
    """A numpy struct defined in gputrace/record/ mirrors a registered C struct: a layer
    cannot add a record layout the header test does not see."""
    registered = {id(m.dtype) for m in MIRRORS.values()}
    for mod in MODULES:
        for name, value in vars(mod).items():
            if isinstance(value, np.dtype) and value.names:
                assert id(value) in registered, (
                    f"{mod.__name__}.{name} is a struct dtype with no mirror() registration")


def test_every_layer_buffer_record_is_a_mirror() -> None:
    """Each recorder layer's buffers decode records of a registered mirror (the driver's
    own records, a raw unit with no fields, are the driver layer's: checked against the
    driver's facts, not a header of ours)."""
    from gputrace.record.layers import RECORDER_LAYERS

    dtypes = [m.dtype for m in MIRRORS.values()]
    for cls in RECORDER_LAYERS:
        for kind, buf in cls.BUFFERS.items():
            assert buf.dtype.names is None or any(buf.dtype is d for d in dtypes), (
                cls.__name__, kind)
    assert {m.struct for m in MIRRORS.values()} >= {
        "ioctl_event", "mapping_event", "proc_event", "fd_event", "fault_event", "cuda_event",
        "oom_event"}
    assert decode_cuda.CUDA_DTYPE is MIRRORS["cuda_event"].dtype


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
