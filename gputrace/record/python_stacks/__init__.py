"""Python frames of API-layer stacks (probes/cuda_python.bpf.h walks them).

The recorder tells the probe where each traced CPython keeps its threads
(`register`, when a process is first seen), names the code objects the probe
kept (`frames`, at the drain, while the process lives) and merges them with the
native frames (`merge`). docs/record.md, "Python frames".
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import numpy.typing as npt

from gputrace.record.python_stacks import code as pycode
from gputrace.record.python_stacks import layouts, process
from gputrace.record.python_stacks.layouts import NONE, LayoutError

PyFrame = tuple[str | None, str | None, int | None, int, int, bool]
"""(function, file, line, code address, bytecode offset, ends an eval-loop call)."""
UNKNOWN_EXITED = "exited before its stack was read"
UNKNOWN_NOT_CODE = "not a code object"
NO_NATIVE = 0xFFFFFFFF  # low half of a stack key whose native walk got nothing
EVAL_FRAME = "_PyEval_EvalFrameDefault"


def stack_keys(native: npt.NDArray[Any], py: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
    """The `stack_id` of each call: the native stack's id where there is no Python
    stack (as before Python frames were walked), else (python id + 1) << 32 | the
    native id (NO_NATIVE when none). < 0: no stack at all."""
    nat = native.astype(np.int64)
    pyi = py.astype(np.int64)
    low = np.where(nat >= 0, nat, NO_NATIVE)
    return np.where(pyi >= 0, ((pyi + 1) << 32) | low, nat)


def split_key(key: int) -> tuple[int, int]:
    """(native id or -1, python id or -1) of a stack key."""
    if key < 1 << 32:
        return key, -1
    low = key & 0xFFFFFFFF
    return (-1 if low == NO_NATIVE else low), (key >> 32) - 1


class PythonStacks:
    """The recorder's side of the Python walk: one entry per CPython process."""

    def __init__(self, procs_map: Any, stacks_map: Any) -> None:
        self.procs_map = procs_map
        self.stacks_map = stacks_map
        self.procs: dict[int, process.PyProcess] = {}
        self.tried: set[int] = set()
        self.codes: dict[tuple[int, int], pycode.Code | None] = {}
        self.warnings: dict[int, str] = {}
        self.frames = 0
        self.unknown = 0  # frames whose code object could not be read
        self.unknown_reasons: dict[str, int] = {}  # UNKNOWN_* -> frames
        self.table_left: dict[int, int] = {}  # pid -> line-table bytes it may still cost

    def register(self, pid: int) -> None:
        """Find `pid`'s CPython (once) and hand the probe its layout."""
        if pid in self.tried:
            return
        self.tried.add(pid)
        try:
            p = process.find(pid)
        except process.NotPython:
            return
        except LayoutError as e:
            self.warnings[pid] = f"pid {pid}: {e}; native frames only"
            return
        lay = p.layout
        leaf = self.procs_map.Leaf()
        leaf.interp_head = p.runtime + lay.runtime_interp_head
        leaf.interp_next, leaf.interp_threads = lay.interp_next, lay.interp_threads
        leaf.ts_next, leaf.ts_tid, leaf.ts_frame = lay.ts_next, lay.ts_tid, lay.ts_frame
        leaf.ts_size, leaf.cframe_frame = lay.ts_size, lay.cframe_frame
        leaf.pthread_tid = p.pthread_tid
        leaf.fr_code, leaf.fr_prev, leaf.fr_instr = lay.fr_code, lay.fr_prev, lay.fr_instr
        leaf.fr_entry, leaf.fr_owner, leaf.fr_size = lay.fr_entry, lay.fr_owner, lay.fr_size
        # 3.11+: _PyInterpreterFrames lie in the thread's data stack (a page at once)
        leaf.page_mask = ~4095 & (1 << 64) - 1 if lay.version >= (3, 11) else (1 << 64) - 1
        leaf.entry_all = int(lay.entry_kind == layouts.ENTRY_EVERY)
        leaf.entry_mask = 0xFF if lay.entry_kind == layouts.ENTRY_FLAG else 0
        leaf.shim_owner = 3 if lay.entry_kind == layouts.ENTRY_SHIM else 0x100
        leaf.fr_entry = 0 if lay.fr_entry == NONE else lay.fr_entry
        leaf.fr_owner = 0 if lay.fr_owner == NONE else lay.fr_owner
        self.procs_map[self.procs_map.Key(pid)] = leaf
        self.procs[pid] = p

    def versions(self) -> dict[str, str]:
        """{pid: "3.12"} of the processes walked."""
        return {str(pid): "{}.{}".format(*p.layout.version) for pid, p in self.procs.items()}

    def forget(self, pid: int) -> None:
        p = self.procs.pop(pid, None)
        if p is not None:
            p.mem.close()
        self.tried.discard(pid)
        self.warnings.pop(pid, None)
        self.table_left.pop(pid, None)
        for key in [k for k in self.codes if k[0] == pid]:
            del self.codes[key]
        with contextlib.suppress(KeyError):
            del self.procs_map[self.procs_map.Key(pid)]

    def _code(self, p: process.PyProcess, pid: int, addr: int) -> pycode.Code | None:
        """The code object at `addr` of `pid`, read and its line table decoded once."""
        key = (pid, addr)
        if key not in self.codes:
            left = self.table_left.get(pid, pycode.PROCESS_TABLES)
            c = pycode.read_code(p.mem, p.layout, p.code_type, addr, left)
            if c is not None:
                self.table_left[pid] = left - len(c.linetable)
            self.codes[key] = c
        return self.codes[key]

    def read_stack(self, pid: int, py_id: int) -> None:
        """Read (once) the code objects of a stack while the process is stopped;
        `frames_of` names them later, whenever the process has gone."""
        p = self.procs.get(pid)
        if p is None:
            return
        st = self.stacks_map[self.stacks_map.Key(py_id)]
        for i in range(min(int(st.n), len(st.code))):
            self._code(p, pid, int(st.code[i]) & ~1)

    def frames_of(self, pid: int, py_id: int) -> list[PyFrame]:
        """(function, file, line, code address, bytecode offset, ends an eval-loop
        call) per Python frame of a stack, innermost first; names are None when the
        code object is gone (the process exited before the drain)."""
        st = self.stacks_map[self.stacks_map.Key(py_id)]
        p = self.procs.get(pid)
        out: list[PyFrame] = []
        for i in range(min(int(st.n), len(st.code))):
            word, instr = int(st.code[i]), int(st.instr[i])
            addr, entry = word & ~1, bool(word & 1)
            c = self._code(p, pid, addr) if p is not None else None
            self.frames += 1
            if c is None:
                self.unknown += 1
                why = UNKNOWN_NOT_CODE if p is not None and process.alive(pid) else UNKNOWN_EXITED
                self.unknown_reasons[why] = self.unknown_reasons.get(why, 0) + 1
                out.append((None, None, None, addr, 0, entry))
                continue
            assert p is not None
            line = pycode.line_of(c, p.layout, instr)
            offset = (max(instr & 0x7FFFFFFF, 0) * 2 if p.layout.co_code_adaptive == NONE
                      else max(instr - c.bytecode, 0))
            out.append((c.name, c.filename, line, addr, offset, entry))
        return out


def merge(pid: int, stack_id: int, native: list[dict[str, Any]],
          python: list[PyFrame]) -> list[dict[str, Any]]:
    """Rows of one stack: native frames, each _PyEval_EvalFrameDefault replaced by
    the Python frames of its call (as py-spy --native and memray show them),
    innermost first; Python frames the native walk did not reach (it stops where
    libraries keep no frame pointer) come after the native frames."""
    groups: list[list[dict[str, Any]]] = [[]]
    for function, filename, line, addr, offset, entry in python:
        groups[-1].append({"pid": pid, "stack_id": stack_id, "ip": addr, "module": None,
                           "offset": offset, "symbol": None, "kind": "python",
                           "function": function, "filename": filename, "line": line})
        if entry:
            groups.append([])
    groups = [g for g in groups if g]
    rows: list[dict[str, Any]] = []
    for r in native:
        if r.get("symbol") == EVAL_FRAME and groups:
            rows += groups.pop(0)
        else:
            rows.append({**r, "stack_id": stack_id, "kind": "native"})
    for g in groups:
        rows += g
    for depth, r in enumerate(rows):
        r["depth"] = depth
    return rows
