"""Where CPython keeps what a stack walk needs, per minor version.

3.10, 3.11 and 3.12 do not describe themselves: their offsets are below, one
table a version, each printed with offsetof() by a C file compiled against that
version's installed headers (Py_BUILD_CORE: Include/internal/pycore_runtime.h,
pycore_interp.h, pycore_frame.h, Include/cpython/pystate.h, cpython/code.h,
cpython/frameobject.h) at the tag named in its comment. A layout changes only
between minor versions (CPython's ABI promise), so one table serves every patch
release. 3.13 and later write their own offsets, `_Py_DebugOffsets`, at the start
of `_PyRuntime`: read from the process (`from_debug_offsets`), never assumed.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

NONE = 0xFFFF  # no such field
ENTRY_EVERY, ENTRY_FLAG, ENTRY_SHIM = 0, 1, 2  # GT_PY_ENTRY_* in probes/gputrace_events.h


@dataclass(frozen=True)
class Layout:
    """One minor version's offsets: the walk's (struct py_proc) and the code
    object's and strings' (read by the recorder to name frames)."""

    version: tuple[int, int]
    runtime_interp_head: int  # _PyRuntimeState.interpreters.head
    interp_next: int
    interp_threads: int
    ts_next: int
    ts_tid: int
    ts_frame: int
    cframe_frame: int
    pthread_tid: bool  # ts_tid is a pthread_t (3.10): the kernel tid is read from glibc's struct
    fr_code: int
    fr_prev: int
    fr_instr: int
    fr_entry: int
    fr_owner: int
    instr32: bool
    entry_kind: int
    co_name: int
    co_qualname: int  # NONE before 3.11
    co_filename: int
    co_firstlineno: int
    co_linetable: int
    co_code_adaptive: int  # NONE in 3.10 (f_lasti is an index, not an address)
    ascii_size: int  # sizeof(PyASCIIObject)
    compact_size: int  # sizeof(PyCompactUnicodeObject)

    @property
    def ts_size(self) -> int:
        return max(self.ts_next, self.ts_tid, self.ts_frame) + 8

    @property
    def fr_size(self) -> int:
        # fr_instr is read as a word even where it is an int (3.10: f_lineno follows)
        last = max(self.fr_code, self.fr_prev, self.fr_instr,
                   *(x for x in (self.fr_entry, self.fr_owner) if x != NONE))
        return last + 8

    @property
    def code_size(self) -> int:
        """Bytes of a code object read to name it."""
        fields = (self.co_name, self.co_qualname, self.co_filename, self.co_linetable,
                  self.co_firstlineno)
        return max(x for x in fields if x != NONE) + 8


# v3.10.13 (Include/internal/pycore_runtime.h, pycore_interp.h, cpython/pystate.h,
# cpython/frameobject.h, cpython/code.h): no _PyInterpreterFrame yet; every Python
# call is a PyFrameObject and a _PyEval_EvalFrameDefault call of its own.
PY310 = Layout(
    version=(3, 10), runtime_interp_head=32, interp_next=0, interp_threads=8,  # tstate_head
    ts_next=8, ts_tid=176, ts_frame=24, cframe_frame=NONE, pthread_tid=True,  # thread_id, frame
    fr_code=32, fr_prev=24, fr_instr=96, fr_entry=NONE, fr_owner=NONE, instr32=True,  # f_lasti
    entry_kind=ENTRY_EVERY, co_name=112, co_qualname=NONE, co_filename=104,
    co_firstlineno=40, co_linetable=120, co_code_adaptive=NONE, ascii_size=48, compact_size=72,
)
# v3.11.7 (same headers; Include/internal/pycore_frame.h holds _PyInterpreterFrame):
# ts_frame is PyThreadState.cframe, whose current_frame is the innermost frame;
# is_entry marks the first frame of each _PyEval_EvalFrameDefault call.
PY311 = Layout(
    version=(3, 11), runtime_interp_head=40, interp_next=0, interp_threads=16,
    ts_next=8, ts_tid=160, ts_frame=56, cframe_frame=8, pthread_tid=False,  # native_thread_id
    fr_code=32, fr_prev=48, fr_instr=56, fr_entry=68, fr_owner=69, instr32=False,  # prev_instr
    entry_kind=ENTRY_FLAG, co_name=120, co_qualname=128, co_filename=112,
    co_firstlineno=72, co_linetable=136, co_code_adaptive=184, ascii_size=48, compact_size=72,
)
# v3.12.1: an entry frame owned by the C stack (FRAME_OWNED_BY_CSTACK) lies below
# the first frame of each _PyEval_EvalFrameDefault call.
PY312 = Layout(
    version=(3, 12), runtime_interp_head=40, interp_next=0, interp_threads=72,
    ts_next=8, ts_tid=144, ts_frame=56, cframe_frame=0, pthread_tid=False,
    fr_code=0, fr_prev=8, fr_instr=56, fr_entry=NONE, fr_owner=70, instr32=False,
    entry_kind=ENTRY_SHIM, co_name=120, co_qualname=128, co_filename=112,
    co_firstlineno=68, co_linetable=136, co_code_adaptive=192, ascii_size=40, compact_size=56,
)
TABLES = {PY310.version: PY310, PY311.version: PY311, PY312.version: PY312}
DEBUG_COOKIE = b"xdebugpy"
# _Py_DebugOffsets as v3.13.0 lays it out (Include/internal/pycore_runtime.h): cookie,
# version, free_threaded, then groups of u64, each starting with the struct's size.
# The struct itself changes between minor versions, so only 3.13's is read.
_DEBUG_GROUPS = (
    ("runtime_state", ("size", "finalizing", "interpreters_head")),
    ("interpreter_state", ("size", "id", "next", "threads_head", "gc", "imports_modules",
                           "sysdict", "builtins", "ceval_gil", "gil_runtime_state",
                           "gil_runtime_state_enabled", "gil_runtime_state_locked",
                           "gil_runtime_state_holder")),
    ("thread_state", ("size", "prev", "next", "interp", "current_frame", "thread_id",
                      "native_thread_id", "datastack_chunk", "status")),
    ("interpreter_frame", ("size", "previous", "executable", "instr_ptr", "localsplus",
                           "owner")),
    ("code_object", ("size", "filename", "name", "qualname", "linetable", "firstlineno",
                     "argcount", "localsplusnames", "localspluskinds", "co_code_adaptive")),
    ("pyobject", ("size", "ob_type")),
    ("type_object", ("size", "tp_name", "tp_repr", "tp_flags")),
    ("tuple_object", ("size", "ob_item", "ob_size")),
    ("list_object", ("size", "ob_item", "ob_size")),
    ("dict_object", ("size", "ma_keys", "ma_values")),
    ("float_object", ("size", "ob_fval")),
    ("long_object", ("size", "lv_tag", "ob_digit")),
    ("bytes_object", ("size", "ob_size", "ob_sval")),
    ("unicode_object", ("size", "state", "length", "asciiobject_size")),
)
UNICODE_STATE, BYTES_SVAL = 32, 32  # PyASCIIObject.state, PyBytesObject.ob_sval: 3.10 to 3.13
DEBUG_SIZE = 24 + 8 * sum(len(f) for _g, f in _DEBUG_GROUPS)


class LayoutError(ValueError):
    pass


def version_of(hexversion: int) -> tuple[int, int]:
    """(major, minor) of a PY_VERSION_HEX value."""
    return (hexversion >> 24) & 0xFF, (hexversion >> 16) & 0xFF


def from_debug_offsets(raw: bytes) -> Layout:
    """The layout a 3.13 interpreter describes in its `_Py_DebugOffsets` (the
    first DEBUG_SIZE bytes of `_PyRuntime`); LayoutError when it is not one, is
    another version's, or a free-threaded build (its objects differ)."""
    if len(raw) < DEBUG_SIZE or raw[:8] != DEBUG_COOKIE:
        raise LayoutError("no _Py_DebugOffsets at the start of _PyRuntime")
    hexversion, free_threaded = struct.unpack_from("<QQ", raw, 8)
    if version_of(hexversion) != (3, 13):
        raise LayoutError(f"_Py_DebugOffsets of version {hexversion:#x}, a layout this "
                          "gputrace does not know")
    if free_threaded:
        raise LayoutError("a free-threaded CPython build")
    values = struct.unpack_from(f"<{(DEBUG_SIZE - 24) // 8}Q", raw, 24)
    d: dict[str, int] = {}
    i = 0
    for group, fields in _DEBUG_GROUPS:
        for f in fields:
            d[f"{group}.{f}"] = values[i]
            i += 1
    used = ("runtime_state.interpreters_head", "interpreter_state.next",
            "interpreter_state.threads_head", "thread_state.next", "thread_state.current_frame",
            "thread_state.native_thread_id", "interpreter_frame.previous",
            "interpreter_frame.executable", "interpreter_frame.instr_ptr",
            "interpreter_frame.owner", "code_object.name", "code_object.qualname",
            "code_object.filename", "code_object.linetable", "code_object.firstlineno",
            "code_object.co_code_adaptive", "unicode_object.asciiobject_size")
    if any(d[k] >= NONE for k in used):  # the probe takes u16 offsets
        raise LayoutError("_Py_DebugOffsets holds offsets no structure has")
    if d["unicode_object.state"] != UNICODE_STATE or d["bytes_object.ob_sval"] != BYTES_SVAL:
        raise LayoutError("_Py_DebugOffsets places str or bytes fields elsewhere")
    ascii_size = d["unicode_object.asciiobject_size"]
    return Layout(
        version=(3, 13), runtime_interp_head=d["runtime_state.interpreters_head"],
        interp_next=d["interpreter_state.next"],
        interp_threads=d["interpreter_state.threads_head"],
        ts_next=d["thread_state.next"], ts_tid=d["thread_state.native_thread_id"],
        ts_frame=d["thread_state.current_frame"], cframe_frame=NONE, pthread_tid=False,
        fr_code=d["interpreter_frame.executable"], fr_prev=d["interpreter_frame.previous"],
        fr_instr=d["interpreter_frame.instr_ptr"], fr_entry=NONE,
        fr_owner=d["interpreter_frame.owner"], instr32=False, entry_kind=ENTRY_SHIM,
        co_name=d["code_object.name"], co_qualname=d["code_object.qualname"],
        co_filename=d["code_object.filename"], co_firstlineno=d["code_object.firstlineno"],
        co_linetable=d["code_object.linetable"],
        co_code_adaptive=d["code_object.co_code_adaptive"], ascii_size=ascii_size,
        # PyCompactUnicodeObject adds utf8_length and utf8 to PyASCIIObject
        compact_size=ascii_size + 16,
    )


def check(layout: Layout) -> Layout:
    """`layout` when every field the probe reads lies within its 512-byte reads."""
    if layout.ts_size > 512 or layout.fr_size > 512:
        raise LayoutError("thread state or frame fields lie past what the probe reads")
    return layout
