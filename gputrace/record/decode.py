"""Numpy mirrors of the C event structs (probes/gputrace_events.h) and bulk
decoding of ring-buffer bytes into Arrow record batches.

No Python object is made per event: raw records are concatenated, viewed with
`numpy.frombuffer`, and turned into Arrow columns (nullable ones from the
`valid` bit mask, names through small dictionaries).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from gputrace import nvabi, schema
from gputrace.record.arrow_columns import masked
from gputrace.record.driver_version import UVM_NAMES
from gputrace.record.structs import mirror

IOCTL_DTYPE = np.dtype(
    [
        ("ts_ns", "<u8"), ("latency_ns", "<u8"), ("ret", "<i8"), ("size_bytes", "<u8"),
        ("va_base", "<u8"), ("va_length", "<u8"), ("offset", "<u8"), ("alignment", "<u8"),
        ("pid", "<u4"), ("tid", "<u4"), ("fd", "<i4"), ("cmd", "<u4"), ("nr", "<u4"),
        ("status", "<u4"), ("h_client", "<u4"), ("h_parent", "<u4"), ("h_object", "<u4"),
        ("h_class", "<u4"), ("flags", "<u4"), ("attr", "<u4"), ("attr2", "<u4"),
        ("ctrl_cmd", "<u4"), ("ref_fd", "<i4"), ("valid", "<u4"), ("uuid", "u1", (16,)),
        ("comm", "S16"), ("device", "u1"), ("_pad0", "u1"), ("gpu_index", "<i2"),
        ("_pad1", "<u4"),
    ]
)  # fmt: skip
mirror("gputrace_events.h", "ioctl_event", IOCTL_DTYPE)
BATCH_HEADER = 8  # struct ioctl_batch: u32 count, u32 _pad0, then the events
STAGE_EVENTS = 64

MAPPING_DTYPE = np.dtype(
    [
        ("ts_ns", "<u8"), ("latency_ns", "<u8"), ("addr", "<u8"), ("length", "<u8"),
        ("offset", "<u8"), ("ret", "<i8"), ("pid", "<u4"), ("tid", "<u4"), ("prot", "<u4"),
        ("flags", "<u4"), ("fd", "<i4"), ("op", "u1"), ("device", "u1"),
        ("gpu_index", "<i2"), ("comm", "S16"),
    ]
)  # fmt: skip
mirror("gputrace_events.h", "mapping_event", MAPPING_DTYPE)

PROC_DTYPE = np.dtype(
    [
        ("ts_ns", "<u8"), ("kind", "<u4"), ("pid", "<u4"), ("ppid", "<u4"),
        ("exit_code", "<i4"), ("tid", "<u4"), ("_pad0", "<u4"), ("comm", "S16"),
    ]
)  # fmt: skip
mirror("gputrace_events.h", "proc_event", PROC_DTYPE)
PROC_FORK, PROC_EXEC, PROC_EXIT, PROC_SEEN, PROC_UVM_INIT = 1, 2, 3, 4, 5
PROC_START_DTYPE = np.dtype(
    [("fork_ns", "<u8"), ("fork_boot_ns", "<u8"), ("exec_ns", "<u8"), ("cgroup_id", "<u8"),
     ("ppid", "<u4"), ("_pad0", "<u4")]
)  # fmt: skip
"""`struct proc_start`, the `proc_starts` map's value: how a process began."""
mirror("gputrace_events.h", "proc_start", PROC_START_DTYPE)

CONFIG_DTYPE = np.dtype(
    [("self_tgid", "<u4"), ("filter", "<u4"), ("prefix_len", "<u4"), ("comm_cache", "<u4"),
     ("prefix", "S256")]
)  # fmt: skip
mirror("gputrace_events.h", "gt_config", CONFIG_DTYPE)
UVM_LAYOUT_DTYPE = np.dtype(
    [(n, "<u2") for n in ("status", "base", "length", "offset", "uuid", "ref_fd",
                          "h_client", "h_object", "flags")]
    + [("flags_size", "u1"), ("known", "u1"), ("span_lo", "<u2"), ("span_len", "<u2")]
)  # fmt: skip
mirror("gputrace_events.h", "uvm_layout", UVM_LAYOUT_DTYPE)

# valid bits (GT_V_* in gputrace_events.h), in column order
VALID_BITS: dict[str, int] = {
    "status": 0, "h_client": 1, "h_parent": 2, "h_object": 3, "h_class": 4,
    "size_bytes": 5, "va_base": 6, "va_length": 7, "offset": 8, "alignment": 9,
    "flags": 10, "attr": 11, "attr2": 12, "ctrl_cmd": 13, "ref_fd": 14, "gpu_uuid": 15,
}  # fmt: skip

RM_NAMES = nvabi.RM_ESCAPE_NAMES



def command_name(device: int, nr: int) -> str:
    """Readable name of an ioctl: RM escape on ctl/gpu fds, UVM command on uvm fds."""
    if device in (schema.DEV_UVM, schema.DEV_UVM_TOOLS):
        return UVM_NAMES.get(nr, f"UVM_{nr:#x}")
    return RM_NAMES.get(nr, f"NV_ESC_{nr:#x}")


# ------------------------------------------------------------ reading raw records
# Kernel records should always be whole and hold known codes; if a probe or a
# decoder is wrong they may not, and that must cost the bad records, never the
# recording. These return what can be read and how many records were skipped
# (the recorder adds them up in the manifest's `decode_errors`).


def records(raw: bytes, dtype: np.dtype[Any]) -> tuple[npt.NDArray[np.void], int]:
    """The whole `dtype` records in `raw`; a partial one at the end is skipped (1)."""
    n, rest = divmod(len(raw), dtype.itemsize)
    return np.frombuffer(raw, dtype, n), int(rest > 0)


def batched(
    raw: bytes, dtype: np.dtype[Any], max_count: int
) -> tuple[npt.NDArray[np.void], int]:
    """Events from concatenated count-prefixed batches (`struct ioctl_batch`,
    `struct fault_batch`). A batch whose count is past `max_count` or past the
    bytes left cannot be trusted, nor can anything after it (where the next
    batch starts is unknown): the events before it are returned, and the bytes
    from it on are counted as skipped records (at least 1)."""
    out: list[npt.NDArray[np.void]] = []
    pos, n, size = 0, len(raw), dtype.itemsize
    bad = 0
    while pos + BATCH_HEADER <= n:
        count = int.from_bytes(raw[pos : pos + 4], "little")
        end = pos + BATCH_HEADER + count * size
        if count > max_count or end > n:
            bad = max(1, (n - pos - BATCH_HEADER) // size)
            pos = n
            break
        out.append(np.frombuffer(raw, dtype, count, pos + BATCH_HEADER))
        pos = end
    if pos < n:  # a header cut short
        bad += 1
    return (np.concatenate(out) if out else np.empty(0, dtype)), bad


def known(
    ev: npt.NDArray[np.void], codes: Mapping[str, Mapping[int, str]]
) -> tuple[npt.NDArray[np.void], int]:
    """The events whose code fields ({field: names}) hold only known codes, and
    how many were skipped for an unknown one."""
    ok = np.ones(len(ev), bool)
    for name, names in codes.items():
        ok &= np.isin(ev[name], np.fromiter(names, np.int64, len(names)))
    bad = int(len(ev) - np.count_nonzero(ok))
    return (ev if bad == 0 else ev[ok]), bad


def ioctl_events(bodies: bytes) -> npt.NDArray[np.void]:
    """Events from concatenated batch bodies (the records with their 8-byte header cut)."""
    return records(bodies, IOCTL_DTYPE)[0]


def ioctl_events_from_batches(raw: bytes) -> npt.NDArray[np.void]:
    """Events from concatenated `struct ioctl_batch` records (each count-prefixed)."""
    return batched(raw, IOCTL_DTYPE, STAGE_EVENTS)[0]


IOCTL_CODES = {"device": schema.DEVICE_KINDS}
"""Code fields of `struct ioctl_event` and their names: a record with another code is skipped."""


def ioctl_rows(ev: npt.NDArray[np.void]) -> tuple[pa.RecordBatch | None, int]:
    """The `ioctls` rows of staged ioctl events (None when there are none) and how
    many were skipped for an unknown code: the recorder's decode, and the converter's
    of raw parts."""
    ev, unknown = known(ev, IOCTL_CODES)
    return (ioctls_batch(ev) if len(ev) else None), unknown


class RawRecord(NamedTuple):
    """A record kind a trace may hold undecoded in raw parts (`record --raw`)."""

    record: str  # the C struct's name, without `struct `
    table: str  # the table its rows go to
    buffer: str  # the `decode_errors` key of records skipped
    dtype: np.dtype[Any]  # its layout (the C struct's mirror)
    decode: Callable[[npt.NDArray[np.void]], tuple[pa.RecordBatch | None, int]]


RAW_RECORDS = {r.record: r for r in (
    RawRecord("ioctl_event", "ioctls", "ioctl_events", IOCTL_DTYPE, ioctl_rows),
)}  # fmt: skip
"""Record kinds by name. A decoder here needs nothing but the records, since
`gputrace convert` runs later and elsewhere."""


def _strings_from(codes: npt.NDArray[np.integer], names: Mapping[int, str]) -> Any:
    """A string column from integer codes (hash-encoded: O(n), one call per distinct code)."""
    enc = pa.array(codes).dictionary_encode()
    dictionary = pa.array([names[int(u)] for u in enc.dictionary.to_pylist()], pa.string())
    return pa.DictionaryArray.from_arrays(enc.indices, dictionary)


def _fixed(data: npt.NDArray[Any], width: int) -> Any:
    buf = pa.py_buffer(np.ascontiguousarray(data).tobytes())
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), len(data), [None, buf])


def _comm(comm: npt.NDArray[np.bytes_], tid: npt.NDArray[np.integer]) -> Any:
    """comm strings, dictionary-encoded by value (most batches hold a few names)."""
    n = len(comm)
    if n == 0:
        return pa.array([], pa.string())
    raw = np.ascontiguousarray(comm).view(np.uint64).reshape(-1, 2)
    if bool((raw == raw[0]).all()):
        name = bytes(comm[0]).decode("utf-8", "replace")
        return pa.DictionaryArray.from_arrays(
            pa.array(np.zeros(n, np.int32), pa.int32()), pa.array([name], pa.string())
        )
    enc = _fixed(raw, 16).dictionary_encode()
    names = [b.rstrip(b"\0").decode("utf-8", "replace") for b in enc.dictionary.to_pylist()]
    return pa.DictionaryArray.from_arrays(enc.indices, pa.array(names, pa.string()))


def _who(ev: npt.NDArray[np.void]) -> dict[str, Any]:
    """The ts_ns, pid, tid and comm columns every event table starts with."""
    return {
        "ts_ns": pa.array(ev["ts_ns"].astype(np.int64)),
        "pid": pa.array(ev["pid"].astype(np.int32)),
        "tid": pa.array(ev["tid"].astype(np.int32)),
        "comm": _comm(ev["comm"], ev["tid"]),
    }


def _uuid_strings(ev: npt.NDArray[np.void], order: Any, valid: npt.NDArray[np.bool_]) -> Any:
    n = len(valid)
    if not valid.any():
        return pa.nulls(n, pa.string())
    enc = _fixed(_col(ev, "uuid", order), 16).dictionary_encode()
    names = []
    for u in enc.dictionary.to_pylist():
        h = bytes(u).hex()
        names.append(f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}")
    idx = masked(enc.indices.to_numpy(zero_copy_only=False), valid)
    return pa.DictionaryArray.from_arrays(idx, pa.array(names, pa.string()))


def _order(ts: npt.NDArray[np.uint64]) -> npt.NDArray[np.intp] | None:
    """Permutation sorting by time, or None when already sorted (the usual case)."""
    if len(ts) < 2 or bool((ts[1:] >= ts[:-1]).all()):
        return None
    return np.argsort(ts, kind="stable")


def _by_time(ev: npt.NDArray[np.void]) -> npt.NDArray[np.void]:
    """The events in time order (staged batches from several CPUs interleave)."""
    order = _order(ev["ts_ns"])
    return ev if order is None else ev[order]


def _device(ev: npt.NDArray[np.void]) -> dict[str, Any]:
    """device_code, device and gpu_index (null unless /dev/nvidiaN) columns."""
    dev = np.ascontiguousarray(ev["device"])
    gpu = ev["gpu_index"]
    return {
        "device_code": pa.array(dev),
        "device": _strings_from(dev, schema.DEVICE_KINDS),
        "gpu_index": masked(gpu, gpu >= 0),
    }


def _col(ev: npt.NDArray[np.void], name: str, order: npt.NDArray[np.intp] | None) -> Any:
    a = ev[name]
    return np.ascontiguousarray(a) if order is None else a[order]


def ioctls_batch(ev: npt.NDArray[np.void]) -> pa.RecordBatch:
    """Decoded ioctl events as a record batch of the `ioctls` table."""
    order = _order(ev["ts_ns"])

    def col(name: str) -> Any:
        return _col(ev, name, order)

    valid = col("valid")
    dev = col("device")
    gpu = col("gpu_index")
    nr = col("nr")
    tid = col("tid")
    keys = (dev.astype(np.uint64) << np.uint64(32)) | nr.astype(np.uint64)
    kenc = pa.array(keys).dictionary_encode()
    distinct = kenc.dictionary.to_pylist()
    names = [command_name(k >> 32, k & 0xFFFFFFFF) for k in distinct]
    cols: dict[str, Any] = {
        "ts_ns": pa.array(col("ts_ns").view(np.int64)),
        "pid": pa.array(col("pid").view(np.int32)),
        "tid": pa.array(tid.view(np.int32)),
        "comm": _comm(col("comm"), tid),
        "device_code": pa.array(dev),
        "device": _strings_from(dev, _DEVICE_NAMES),
        "gpu_index": masked(gpu, gpu >= 0),
        "fd": pa.array(col("fd")),
        "cmd": pa.array(col("cmd")),
        "nr": pa.array(nr),
        "name": pa.DictionaryArray.from_arrays(kenc.indices, pa.array(names, pa.string())),
        "ret": pa.array(col("ret")),
        "latency_ns": pa.array(col("latency_ns").view(np.int64)),
    }
    for name, bit in VALID_BITS.items():
        ok = (valid & np.uint32(1 << bit)) != 0
        if name == "gpu_uuid":
            cols[name] = _uuid_strings(ev, order, ok)
        elif not ok.any():
            cols[name] = pa.nulls(len(ev), schema.IOCTLS.column(name).type)  # type: ignore[call-overload]
        else:
            cols[name] = masked(col(name), ok)
    batch = _batch(schema.IOCTLS, cols)
    # the batch's commands, known here for free, ride to the part's footer
    # (schema.IOCTL_COMMANDS): readers then need not scan the names
    meta: dict[bytes, bytes] = {**(batch.schema.metadata or {}),
                                _COMMANDS_KEY: _commands_value(frozenset(distinct))}
    return batch.replace_schema_metadata(meta)


_COMMANDS_KEY = schema.IOCTL_COMMANDS.key.encode()


@functools.lru_cache(maxsize=256)
def _commands_value(keys: frozenset[int]) -> bytes:
    """The footer value of commands `keys` (device << 32 | nr): a busy process's
    batches mostly repeat one set, encoded once."""
    return schema.IOCTL_COMMANDS.encode(
        (k >> 32, k & 0xFFFFFFFF, _DEVICE_NAMES[k >> 32], command_name(k >> 32, k & 0xFFFFFFFF))
        for k in keys)


_DEVICE_NAMES = schema.DEVICE_KINDS


def mappings_batch(ev: npt.NDArray[np.void]) -> pa.RecordBatch:
    ev = _by_time(ev)
    op = ev["op"]
    dev = ev["device"]
    ret = ev["ret"]
    is_mmap = op == 1
    ok = ~((ret < 0) & (ret > -4096))
    managed = is_mmap & ok & (dev == schema.DEV_UVM) & (ev["offset"] == ev["addr"])
    cols: dict[str, Any] = {
        **_who(ev),
        "op_code": pa.array(op),
        "op": _strings_from(op, schema.MAPPING_OPS),
        **_device(ev),
        "fd": pa.array(ev["fd"]),
        "addr": masked(ev["addr"], ~(is_mmap & ~ok)),
        "length": pa.array(ev["length"]),
        "offset": masked(ev["offset"], is_mmap),
        "prot": masked(ev["prot"], is_mmap),
        "flags": masked(ev["flags"], is_mmap),
        "ret": pa.array(ret),
        "managed": pa.array(managed),
        "latency_ns": pa.array(ev["latency_ns"].astype(np.int64)),
    }
    return _batch(schema.MAPPINGS, cols)


# ------------------------------------------------ open/close/dup of NVIDIA fds (files)
FD_DTYPE = np.dtype(
    [
        ("ts_ns", "<u8"), ("ret", "<i8"), ("pid", "<u4"), ("tid", "<u4"), ("fd", "<i4"),
        ("new_fd", "<i4"), ("op", "u1"), ("device", "u1"), ("gpu_index", "<i2"),
        ("valid", "u1"), ("_pad0", "u1"), ("_pad1", "<u2"), ("comm", "S16"),
    ]
)  # fmt: skip
mirror("gputrace_events.h", "fd_event", FD_DTYPE)
FD_OPEN, FD_CLOSE, FD_DUP, FD_SEEN = 1, 2, 3, 4  # GT_FD_*
FV_RET = 1  # GT_FV_RET: ret holds a value


def files_batch(ev: npt.NDArray[np.void]) -> pa.RecordBatch:
    """`struct fd_event`s (and the recorder's "seen" rows) as a batch of `files`:
    new_fd only for dups, ret only where GT_FV_RET is set, gpu_index only for nvidiaN."""
    ev = _by_time(ev)
    op = np.ascontiguousarray(ev["op"])
    cols: dict[str, Any] = {
        **_who(ev),
        "fd_op_code": pa.array(op),
        "fd_op": _strings_from(op, schema.FD_OPS),
        **_device(ev),
        "fd": pa.array(ev["fd"]),
        "new_fd": masked(ev["new_fd"], op == FD_DUP),
        "ret": masked(ev["ret"], (ev["valid"] & FV_RET) != 0),
    }
    return _batch(schema.FILES, cols)


def seen_events(
    fds: Mapping[tuple[int, int], tuple[int, int]], ts_ns: int, comms: Mapping[int, str | None]
) -> npt.NDArray[np.void]:
    """"seen" rows for fds already open at start ({(pid, fd): (kind, gpu)} as
    procfs.seed gives them): tid = pid, comm from `comms`, no ret."""
    ev = np.zeros(len(fds), FD_DTYPE)
    for i, ((pid, fd), (kind, gpu)) in enumerate(sorted(fds.items())):
        ev[i] = (ts_ns, 0, pid, pid, fd, -1, FD_SEEN, kind, gpu, 0, 0, 0,
                 (comms.get(pid) or "").encode()[:16])  # fmt: skip
    return ev


def _batch(t: schema.Table, cols: dict[str, Any]) -> pa.RecordBatch:
    arrays = []
    for c in t.columns:
        a = cols[c.name]
        if isinstance(a, pa.DictionaryArray):
            a = a.cast(pa.string()) if c.type == pa.string() else a
        arrays.append(a.cast(c.type) if a.type != c.type else a)
    return pa.RecordBatch.from_arrays(arrays, schema=t.arrow_schema)
