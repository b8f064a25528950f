"""A compiled BPF program as plain data, and a bcc-compatible object loaded from it
without clang: what makes the BPF object cache (bpf_cache.py) possible with bcc 0.26.

bcc compiles a program and creates its maps in one step
(`bpf_module_create_c_from_string`); its instructions then hold the maps' fds in
their 64-bit immediate loads (BPF_PSEUDO_MAP_FD). `extract` reads a compiled
module through libbcc's C API (each function's instructions with every map fd
turned back into the map's index, the maps' types, sizes, flags and key/leaf type
descriptions) into an `Entry`; `CachedBPF` makes the maps again with the bpf
syscall, patches the fresh fds in and loads each function, and is a `bcc.BPF`
for everything the recorder does afterwards (tables, ring buffers, tracepoints,
uprobes, cleanup). What it does differently: the autoloaded programs go through
the verifier in parallel threads, and the attached tracepoints are closed in
parallel at cleanup (each close waits a grace period of ~80 ms, 27 of them one
after the other took 2 s).
"""

from __future__ import annotations

import base64
import concurrent.futures as cf
import ctypes
import json
import os
import platform
import threading
from dataclasses import dataclass
from typing import Any

_NR_BPF = 321 if platform.machine() == "x86_64" else 280
_MAP_CREATE, _PROG_LOAD, _BTF_LOAD = 0, 5, 18
_PSEUDO_MAP_FD = 1
_LD_IMM64 = 0x18
# map types a cached program may hold: those bcc makes with nothing beyond
# type, sizes and flags (the local storages with a two-type BTF made here)
_PLAIN = {1, 2, 3, 5, 6, 9, 10, 27}  # hash, array, prog array, percpu x2, lru x2, ringbuf
_RINGBUF = 27
_STORAGE = {24, 28, 29, 32}  # sk, inode, task, cgroup storage: need BTF key/value types
_AUTOLOAD = (("tracepoint__", 5), ("kprobe__", 2), ("kretprobe__", 2))  # BPF.TRACEPOINT/KPROBE
_construct = threading.Lock()


class NotCacheable(Exception):
    """The compiled program holds something the cache cannot rebuild (it stays bcc's)."""


@dataclass(frozen=True)
class MapDesc:
    name: str
    type: int
    key_size: int
    leaf_size: int
    max_entries: int
    flags: int
    key_desc: str
    leaf_desc: str


@dataclass(frozen=True)
class Entry:
    """A compiled program: functions (name -> instructions, each map fd replaced by
    the map's index in `tables`), its license and kernel version word."""

    functions: dict[str, bytes]
    tables: list[MapDesc]
    license: str
    kern_version: int

    def to_json(self) -> dict[str, Any]:
        return {"functions": {k: base64.b64encode(v).decode() for k, v in self.functions.items()},
                "tables": [t.__dict__ for t in self.tables], "license": self.license,
                "kern_version": self.kern_version}  # fmt: skip

    @staticmethod
    def from_json(doc: dict[str, Any]) -> Entry:
        """The entry `doc` holds; ValueError/KeyError/TypeError when it is not one."""
        tables = [MapDesc(str(t["name"]), int(t["type"]), int(t["key_size"]),
                        int(t["leaf_size"]), int(t["max_entries"]), int(t["flags"]),
                        str(t["key_desc"]), str(t["leaf_desc"]))
                  for t in doc["tables"]]  # fmt: skip
        funcs = {str(k): base64.b64decode(v, validate=True) for k, v in doc["functions"].items()}
        e = Entry(funcs, tables, str(doc["license"]), int(doc["kern_version"]))
        e.check()
        return e

    def check(self) -> None:
        """Every instruction stream whole, every map reference to a map of the entry."""
        for t in self.tables:
            if t.type not in _PLAIN | _STORAGE or not t.name or len(t.name) > 64:
                raise ValueError(f"table {t.name!r}: type {t.type}")
            json.loads(t.key_desc), json.loads(t.leaf_desc)
        for name, raw in self.functions.items():
            if not raw or len(raw) % 8:
                raise ValueError(f"function {name}: {len(raw)} bytes")
            for i in range(0, len(raw), 8):
                at = int.from_bytes(raw[i + 4 : i + 8], "little")
                if raw[i] == _LD_IMM64 and raw[i + 1] >> 4 == _PSEUDO_MAP_FD and not (
                    0 <= at < len(self.tables)
                ):
                    raise ValueError(f"function {name}: map index out of range")


def _lib() -> Any:
    from bcc import libbcc

    lib = libbcc.lib
    for name, res, args in (
        ("bpf_num_tables", ctypes.c_size_t, [ctypes.c_void_p]),
        ("bpf_table_name", ctypes.c_char_p, [ctypes.c_void_p, ctypes.c_ulonglong]),
        ("bpf_table_fd_id", ctypes.c_int, [ctypes.c_void_p, ctypes.c_ulonglong]),
        ("bpf_table_key_size_id", ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_ulonglong]),
        ("bpf_table_leaf_size_id", ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_ulonglong]),
        ("bpf_num_functions", ctypes.c_size_t, [ctypes.c_void_p]),
        ("bpf_function_name", ctypes.c_char_p, [ctypes.c_void_p, ctypes.c_size_t]),
    ):
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    return lib


def extract(module: int) -> Entry:
    """The Entry of a module bcc compiled (`bpf_module_create_c_from_string`).
    A table shared with another module ("extern", BPF_TABLE_SHARED) looks like its
    own here (its fd is in the module's list): such programs must not be cached
    (bpf_cache.UNCACHED_FLAGS are the flags that make gputrace's share)."""
    lib = _lib()
    tables: list[MapDesc] = []
    index: dict[int, int] = {}
    for i in range(lib.bpf_num_tables(module)):
        name = lib.bpf_table_name(module, i).decode()
        fd = lib.bpf_table_fd_id(module, i)
        ttype = lib.bpf_table_type_id(module, i)
        if fd < 0 or ttype not in _PLAIN | _STORAGE:
            raise NotCacheable(f"table {name}: type {ttype}, fd {fd}")
        index[fd] = len(tables)
        b = name.encode()
        tables.append(MapDesc(name, ttype, int(lib.bpf_table_key_size_id(module, i)),
                            int(lib.bpf_table_leaf_size_id(module, i)),
                            int(lib.bpf_table_max_entries_id(module, i)),
                            int(lib.bpf_table_flags_id(module, i)),
                            lib.bpf_table_key_desc(module, b).decode(),
                            lib.bpf_table_leaf_desc(module, b).decode()))  # fmt: skip
    funcs = {}
    for i in range(lib.bpf_num_functions(module)):
        name = lib.bpf_function_name(module, i)
        raw = bytearray(ctypes.string_at(lib.bpf_function_start(module, name),
                                         lib.bpf_function_size(module, name)))  # fmt: skip
        for k in range(0, len(raw), 8):
            if raw[k] == _LD_IMM64 and raw[k + 1] >> 4 == _PSEUDO_MAP_FD:
                fd = int.from_bytes(raw[k + 4 : k + 8], "little", signed=True)
                if fd not in index:  # a map of another module (extern): not ours to make
                    raise NotCacheable(f"{name.decode()}: map fd {fd} is not one of its tables")
                raw[k + 4 : k + 8] = index[fd].to_bytes(4, "little")
        funcs[name.decode()] = bytes(raw)
    lic = lib.bpf_module_license(module).decode()
    return Entry(funcs, tables, lic, int(lib.bpf_module_kern_version(module)))


def _bpf(cmd: int, attr: ctypes.Structure) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return int(libc.syscall(ctypes.c_long(_NR_BPF), ctypes.c_int(cmd), ctypes.byref(attr),
                            ctypes.c_uint(ctypes.sizeof(attr))))  # fmt: skip


class _MapAttr(ctypes.Structure):
    _fields_ = [("map_type", ctypes.c_uint32), ("key_size", ctypes.c_uint32),
                ("value_size", ctypes.c_uint32), ("max_entries", ctypes.c_uint32),
                ("map_flags", ctypes.c_uint32), ("inner_map_fd", ctypes.c_uint32),
                ("numa_node", ctypes.c_uint32), ("map_name", ctypes.c_char * 16),
                ("map_ifindex", ctypes.c_uint32), ("btf_fd", ctypes.c_uint32),
                ("btf_key_type_id", ctypes.c_uint32),
                ("btf_value_type_id", ctypes.c_uint32)]  # fmt: skip


class _BtfAttr(ctypes.Structure):
    _fields_ = [("btf", ctypes.c_uint64), ("btf_log_buf", ctypes.c_uint64),
                ("btf_size", ctypes.c_uint32), ("btf_log_size", ctypes.c_uint32),
                ("btf_log_level", ctypes.c_uint32)]  # fmt: skip


def _storage_btf(value_size: int) -> int:
    """A BTF object of two types, [1] int (the storage key) and [2] a struct of
    `value_size` bytes: what the kernel asks of a local-storage map (bcc hands it
    the program's own BTF)."""
    strings = b"\0int\0v\0"
    types = b"".join(int(x).to_bytes(4, "little") for x in (
        1, 1 << 24, 4, 0x01000020,  # INT "int", 4 bytes, signed 32 bits
        5, 4 << 24, value_size))  # STRUCT "v", no members  # fmt: skip
    hdr = b"".join(int(x).to_bytes(n, "little") for x, n in (
        (0xEB9F, 2), (1, 1), (0, 1), (24, 4), (0, 4), (len(types), 4), (len(types), 4),
        (len(strings), 4)))  # fmt: skip
    blob = ctypes.create_string_buffer(hdr + types + strings)
    fd = _bpf(_BTF_LOAD, _BtfAttr(btf=ctypes.addressof(blob), btf_size=len(blob.raw) - 1))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"BTF for a storage map: {os.strerror(err)}")
    return fd


def create_map(t: MapDesc) -> int:
    """A new map like table `t`; its fd."""
    attr = _MapAttr(map_type=t.type, key_size=t.key_size, value_size=t.leaf_size,
                    max_entries=t.max_entries, map_flags=t.flags,
                    map_name=t.name.encode()[:15])  # fmt: skip
    if t.type == _RINGBUF:
        attr.key_size = attr.value_size = 0
    btf = -1
    if t.type in _STORAGE:
        btf = _storage_btf(t.leaf_size)
        attr.btf_fd, attr.btf_key_type_id, attr.btf_value_type_id = btf, 1, 2
    try:
        fd = _bpf(_MAP_CREATE, attr)
    finally:
        if btf >= 0:
            os.close(btf)
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"map {t.name}: {os.strerror(err)}")
    return fd


class _ProgAttr(ctypes.Structure):
    _fields_ = [("prog_type", ctypes.c_uint32), ("insn_cnt", ctypes.c_uint32),
                ("insns", ctypes.c_uint64), ("license", ctypes.c_uint64),
                ("log_level", ctypes.c_uint32), ("log_size", ctypes.c_uint32),
                ("log_buf", ctypes.c_uint64), ("kern_version", ctypes.c_uint32),
                ("prog_flags", ctypes.c_uint32), ("prog_name", ctypes.c_char * 16),
                ("prog_ifindex", ctypes.c_uint32),
                ("expected_attach_type", ctypes.c_uint32)]  # fmt: skip


def make_class(bcc: Any) -> type[Any]:
    """The bcc.BPF subclass for cached programs (bcc is imported at run time only)."""
    global _CLASS
    if _CLASS is None:
        _CLASS = type("CachedBPF", (_Loaded, bcc.BPF), {})
    return _CLASS


_CLASS: type[Any] | None = None


class _Loaded:
    """The methods that replace bcc.BPF's where it would read its C++ module."""

    tables: dict[bytes, Any]
    funcs: dict[bytes, Any]
    tracepoint_fds: dict[bytes, int]

    def _init_loaded(self, entry: Entry) -> None:
        import atexit

        for name in ("kprobe_fds", "uprobe_fds", "tracepoint_fds", "raw_tracepoint_fds",
                     "kfunc_entry_fds", "kfunc_exit_fds", "lsm_fds", "perf_buffers",
                     "open_perf_events", "funcs", "tables"):  # fmt: skip
            setattr(self, name, {})
        self._ringbuf_manager, self.tracefile, self.debug, self.module = None, None, 0, None
        self._entry = entry
        self._insns: dict[str, Any] = {}
        self._map_fds: list[int] = []
        atexit.register(self.cleanup)
        try:
            for t in entry.tables:
                self._map_fds.append(create_map(t))
        except BaseException:
            self._close_maps()
            raise

    def _table(self, name: bytes) -> Any:
        """bcc's Table object of map `name`, made at its first use as bcc makes them.
        bcc's Table classes ask libbcc for a table's type, flags and size by module
        handle (None here): while one is made, a stand-in for libbcc in bcc.table
        answers those three from the entry, and passes every other call (and any
        for a real module) to libbcc."""
        import bcc
        import bcc.table as bt

        i = next((i for i, t in enumerate(self._entry.tables) if t.name.encode() == name), None)
        if i is None:
            raise KeyError(name)
        t = self._entry.tables[i]
        facts = {"bpf_table_type_id": t.type, "bpf_table_flags_id": t.flags,
                 "bpf_table_max_entries_id": t.max_entries}  # fmt: skip

        class Stand:
            def __getattr__(self, fn: str) -> Any:
                if fn not in facts:
                    return getattr(real, fn)
                return lambda m, j: facts[fn] if m is None else getattr(real, fn)(m, j)

        key = bcc.BPF._decode_table_type(json.loads(t.key_desc))
        leaf = bcc.BPF._decode_table_type(json.loads(t.leaf_desc))
        with _construct:
            real = bt.lib
            bt.lib = Stand()
            try:
                return bt.Table(self, i, self._map_fds[i], key, leaf, name)
            finally:
                bt.lib = real

    def __getitem__(self, key: str | bytes) -> Any:
        name = key.encode() if isinstance(key, str) else key
        if name not in self.tables:
            self.tables[name] = self._table(name)
        return self.tables[name]

    def __contains__(self, key: str | bytes) -> bool:
        name = key.encode() if isinstance(key, str) else key
        return any(t.name.encode() == name for t in self._entry.tables)

    def get_table(self, name: str | bytes, *_a: Any, **_k: Any) -> Any:
        return self[name]

    def instructions(self, func: str | bytes) -> tuple[int, int]:
        """Address and size of `func`'s relocated instructions (as bpf_function_start
        and bpf_function_size give them for a bcc module)."""
        name = func.decode() if isinstance(func, bytes) else func
        buf = self._insns.get(name)
        if buf is None:
            raw = bytearray(self._entry.functions[name])
            for k in range(0, len(raw), 8):
                if raw[k] == _LD_IMM64 and raw[k + 1] >> 4 == _PSEUDO_MAP_FD:
                    idx = int.from_bytes(raw[k + 4 : k + 8], "little")
                    raw[k + 4 : k + 8] = self._map_fds[idx].to_bytes(4, "little")
            buf = self._insns[name] = ctypes.create_string_buffer(bytes(raw), len(raw))
        return ctypes.addressof(buf), len(self._entry.functions[name])

    def load_func(self, func_name: str | bytes, prog_type: int, device: Any = None,
                  attach_type: int = -1) -> Any:  # fmt: skip
        import bcc

        name = func_name if isinstance(func_name, bytes) else func_name.encode()
        if name in self.funcs:
            return self.funcs[name]
        if name.decode() not in self._entry.functions:
            raise Exception(f"Unknown program {name.decode()}")
        fd = self._load(name.decode(), prog_type, attach_type)
        fn = bcc.BPF.Function(self, name, fd)
        self.funcs[name] = fn
        return fn

    def _load(self, name: str, prog_type: int, attach_type: int = -1) -> int:
        """BPF_PROG_LOAD; on a refusal the verifier's log is saved to a file the
        exception names (bcc's kind of exception: a bare Exception)."""
        start, size = self.instructions(name)
        lic = ctypes.create_string_buffer(self._entry.license.encode())

        def load(log: Any) -> int:
            attr = _ProgAttr(prog_type=prog_type, insn_cnt=size // 8, insns=start,
                             license=ctypes.addressof(lic),
                             kern_version=self._entry.kern_version,
                             prog_name=name.encode()[:15],
                             expected_attach_type=max(attach_type, 0))  # fmt: skip
            if log is not None:
                attr.log_level, attr.log_size, attr.log_buf = 1, len(log), ctypes.addressof(log)
            return _bpf(_PROG_LOAD, attr)

        fd = load(None)
        if fd < 0:
            err = os.strerror(ctypes.get_errno())
            log = ctypes.create_string_buffer(1 << 22)
            load(log)
            import tempfile

            fd, path = tempfile.mkstemp(prefix=f"gputrace-{name}-", suffix=".log")
            with os.fdopen(fd, "wb") as out:
                out.write(log.value)
            raise Exception(f"Failed to load BPF program {name}: {err} (verifier log in {path})")
        return fd

    def preload(self, names: list[str], prog_type: int) -> None:
        """Load these functions from parallel threads (the verifier runs in the
        loading thread), before attaches that load them one at a time; a function
        that fails here fails again, with its error, where it is attached."""
        todo = [n.encode() for n in names if n.encode() not in self.funcs]
        if len(todo) < 2:
            return
        with cf.ThreadPoolExecutor(min(len(todo), os.cpu_count() or 1)) as pool:
            for f in [pool.submit(self.load_func, n, prog_type) for n in todo]:
                f.exception()

    def _trace_autoload(self) -> None:
        """bcc's autoload (tracepoint__/kprobe__ functions attached by name), with
        the verifier run for all of them at once (it runs in the loading thread)."""
        todo = [(n.encode(), t) for n in self._entry.functions
                for p, t in _AUTOLOAD if n.startswith(p)]  # fmt: skip
        with cf.ThreadPoolExecutor(max(1, min(len(todo), os.cpu_count() or 1))) as pool:
            for f in [pool.submit(self.load_func, n, t) for n, t in todo]:
                f.result()
        for name, _t in todo:
            if name.startswith(b"tracepoint__"):
                tp = name[len(b"tracepoint__") :].replace(b"__", b":")
                self.attach_tracepoint(tp=tp, fn_name=name)  # type: ignore[attr-defined]
            elif name.startswith(b"kprobe__"):
                self.attach_kprobe(event=self.fix_syscall_fnname(name[8:]), fn_name=name)  # type: ignore[attr-defined]
            else:
                self.attach_kretprobe(event=self.fix_syscall_fnname(name[11:]), fn_name=name)  # type: ignore[attr-defined]

    def _close_maps(self) -> None:
        for fd in self._map_fds:
            os.close(fd)
        self._map_fds = []

    def cleanup(self) -> None:
        detach_parallel(self)
        super().cleanup()  # type: ignore[misc]
        self._close_maps()


def detach_parallel(bpf: Any) -> None:
    """Close `bpf`'s tracepoint perf events from as many threads: each close waits
    for an RCU grace period (~80 ms here), and concurrent waits share one."""
    from bcc import libbcc

    fds = list(bpf.tracepoint_fds.items())
    if len(fds) < 2:
        return
    close = libbcc.lib.bpf_close_perf_event_fd
    with cf.ThreadPoolExecutor(min(len(fds), 32)) as pool:
        list(pool.map(lambda kv: close(kv[1]), fds))
    for tp, _fd in fds:
        cat, name = tp.split(b":")
        libbcc.lib.bpf_detach_tracepoint(cat, name)
        del bpf.tracepoint_fds[tp]


def load(bcc: Any, entry: Entry) -> Any:
    """A bcc.BPF-compatible object of the cached program: maps made, autoload
    functions loaded (in parallel) and attached, as `bcc.BPF(text=...)` leaves it."""
    cls = make_class(bcc)
    obj: Any = object.__new__(cls)
    obj._init_loaded(entry)
    try:
        obj._trace_autoload()
    except BaseException:
        obj.cleanup()
        raise
    return obj
