"""Python frames of API stacks without BPF: the layout tables against the
interpreters on this machine (a process is read as the probe reads it), the line
tables against each interpreter's own co_lines(), the struct py_proc mirror, and
how Python frames merge with native ones."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from gputrace.record.python_stacks import NO_NATIVE, layouts, merge, process, split_key, stack_keys
from gputrace.record.python_stacks import code as pycode

PYENV = Path("/root/.pyenv/versions")
INTERPRETERS = {
    (3, 10): PYENV / "3.10.13" / "bin" / "python",
    (3, 11): PYENV / "3.11.7" / "bin" / "python",
    (3, 12): PYENV / "3.12.1" / "bin" / "python",
    (3, 13): PYENV / "3.13.0" / "bin" / "python",
}
DEBIAN = Path("/usr/bin/python3")
PROGRAM = """
import sys
def inner():
    sys.stdout.write("R\\n"); sys.stdout.flush(); sys.stdin.readline()
def outer():
    inner()
outer()
"""  # frames: inner (line 4), outer (line 6), <module> (line 7)
_ALL = [*INTERPRETERS.values(), DEBIAN]


def _walk(p: process.PyProcess) -> list[tuple[str, int | None, bool]]:
    """The main thread's frames read as probes/cuda_python.bpf.h reads them:
    (name, line, ends an eval-loop call), innermost first, shim frames skipped."""
    lay, mem = p.layout, p.mem
    ts = process._thread_states(mem, lay, p.runtime)[-1]  # the oldest: the main thread
    frame = mem.u64(ts + lay.ts_frame)
    if lay.cframe_frame != layouts.NONE:
        frame = mem.u64(frame + lay.cframe_frame) if frame else 0
    out: list[tuple[str, int | None, bool]] = []
    while frame:
        b = mem.read(frame, lay.fr_size)
        assert b is not None

        def w(o: int, b: bytes = b) -> int:
            return int.from_bytes(b[o : o + 8], "little")

        if lay.entry_kind == layouts.ENTRY_SHIM and b[lay.fr_owner] == 3:
            out[-1] = (out[-1][0], out[-1][1], True)
        else:
            instr = (int.from_bytes(b[lay.fr_instr : lay.fr_instr + 4], "little") if lay.instr32
                     else w(lay.fr_instr))
            c = pycode.read_code(mem, lay, p.code_type, w(lay.fr_code))
            assert c is not None
            entry = lay.entry_kind == layouts.ENTRY_EVERY or (
                lay.entry_kind == layouts.ENTRY_FLAG and b[lay.fr_entry] != 0)
            out.append((c.name, pycode.line_of(c, lay, instr), entry))
        frame = w(lay.fr_prev)
    return out


@pytest.mark.parametrize("exe", _ALL, ids=lambda p: str(p).split("/")[-3])
def test_layout_walks_a_live_interpreter(exe: Path) -> None:
    if not exe.exists():
        pytest.skip(f"{exe} not installed")
    proc = subprocess.Popen([str(exe), "-c", PROGRAM], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)  # fmt: skip
    assert proc.stdout is not None and proc.stdin is not None
    try:
        assert proc.stdout.readline() == b"R\n"
        try:
            p = process.find(proc.pid)
        except (PermissionError, process.NotPython) as e:
            pytest.skip(f"process memory not readable here: {e}")
        frames = _walk(p)
        p.mem.close()
    finally:
        proc.stdin.close()
        proc.wait()
    assert [(n, line) for n, line, _e in frames] == [("inner", 4), ("outer", 6), ("<module>", 7)]
    # one eval-loop call holds them all (3.11+), or one each (3.10)
    want = [True] * 3 if p.layout.version == (3, 10) else [False, False, True]
    assert [e for _n, _l, e in frames] == want
    if p.layout.version == (3, 10):
        assert p.pthread_tid == 0x2D0  # glibc 2.3x x86-64: struct pthread's tid


def test_unknown_version_refused() -> None:
    exe = PYENV / "3.9.18" / "bin" / "python"
    if not exe.exists():
        pytest.skip(f"{exe} not installed")
    proc = subprocess.Popen([str(exe), "-c", "import sys; print(1, flush=True); "
                             "sys.stdin.readline()"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
    assert proc.stdout is not None and proc.stdin is not None
    try:
        proc.stdout.readline()
        with pytest.raises(layouts.LayoutError) as e:
            process.find(proc.pid)
    finally:
        proc.stdin.close()
        proc.wait()
    assert str(e.value) == ("CPython 3.9 (libpython3.9.so.1.0): a version whose layout this "
                            "gputrace does not know")


LINES = """
import json, sys
src = '''def f(a):
    x = [i for i in
         range(a)]
    if a:

        return (x,
                a)
    return None
'''
ns = {}
exec(compile(src, "m.py", "exec"), ns)
co = ns["f"].__code__
print(json.dumps({"table": co.co_linetable.hex(), "first": co.co_firstlineno,
                  "lines": list(co.co_lines())}))
"""


@pytest.mark.parametrize("version", list(INTERPRETERS), ids=lambda v: "{}.{}".format(*v))
def test_line_tables_match_co_lines(version: tuple[int, int]) -> None:
    exe = INTERPRETERS[version]
    if not exe.exists():
        pytest.skip(f"{exe} not installed")
    out = json.loads(subprocess.run([str(exe), "-c", LINES], capture_output=True, text=True,
                                    check=True).stdout)  # fmt: skip
    lay = layouts.TABLES.get(version, layouts.PY312)
    table = bytes.fromhex(out["table"])
    code = pycode.Code("f", "m.py", out["first"], table, 0x1000,
                       pycode.decode_lines(table, out["first"], version))
    checked = 0
    for start, end, line in out["lines"]:
        for off in range(start, end, 2):
            # the probe's instruction: f_lasti (an index) in 3.10, an address since
            instr = off // 2 if version == (3, 10) else 0x1000 + off
            got = pycode.line_of(code, lay if version < (3, 13) else layouts.PY312, instr)
            assert got == line, (off, got, line)
            checked += 1
    assert checked >= 10


def test_offsets_match_installed_headers(tmp_path: Path) -> None:
    """The tables are what offsetof() gives with each version's own headers."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc not found")
    fields = {
        "_PyRuntimeState": [("interpreters.head", "runtime_interp_head")],
        "PyInterpreterState": [("next", "interp_next")],
        "PyThreadState": [("next", "ts_next")],
        "PyCodeObject": [("co_name", "co_name"), ("co_filename", "co_filename"),
                         ("co_firstlineno", "co_firstlineno"), ("co_linetable", "co_linetable")],
    }
    per_version = {
        (3, 10): [("PyInterpreterState", "tstate_head", "interp_threads"),
                  ("PyThreadState", "thread_id", "ts_tid"), ("PyThreadState", "frame", "ts_frame"),
                  ("PyFrameObject", "f_back", "fr_prev"), ("PyFrameObject", "f_code", "fr_code"),
                  ("PyFrameObject", "f_lasti", "fr_instr")],
        (3, 11): [("PyInterpreterState", "threads.head", "interp_threads"),
                  ("PyThreadState", "native_thread_id", "ts_tid"),
                  ("PyThreadState", "cframe", "ts_frame"),
                  ("_PyCFrame", "current_frame", "cframe_frame"),
                  ("_PyInterpreterFrame", "f_code", "fr_code"),
                  ("_PyInterpreterFrame", "previous", "fr_prev"),
                  ("_PyInterpreterFrame", "prev_instr", "fr_instr"),
                  ("_PyInterpreterFrame", "is_entry", "fr_entry"),
                  ("_PyInterpreterFrame", "owner", "fr_owner"),
                  ("PyCodeObject", "co_qualname", "co_qualname"),
                  ("PyCodeObject", "co_code_adaptive", "co_code_adaptive")],
    }
    per_version[(3, 12)] = [x for x in per_version[(3, 11)] if x[1] != "is_entry"]
    for version, lay in layouts.TABLES.items():
        inc = PYENV / {(3, 10): "3.10.13", (3, 11): "3.11.7", (3, 12): "3.12.1"}[version] / \
            "include" / "python{}.{}".format(*version)
        if not inc.exists():
            continue
        checks = [(s, f, a) for s, fs in fields.items() for f, a in fs] + per_version[version]
        src = ["#define Py_BUILD_CORE 1", "#include <Python.h>", "#include <stddef.h>",
               "#include <stdio.h>", '#include "frameobject.h"',
               *(['#include "internal/pycore_frame.h"'] if version >= (3, 11) else []),
               '#include "internal/pycore_runtime.h"', '#include "internal/pycore_interp.h"',
               "int main(void) {",
               *(f'printf("%zu\\n", offsetof({s}, {f}));' for s, f, _a in checks),
               'printf("%zu\\n%zu\\n", sizeof(PyASCIIObject), sizeof(PyCompactUnicodeObject));',
               "return 0; }"]
        c = tmp_path / "off.c"
        c.write_text("\n".join(src))
        exe = tmp_path / "off"
        subprocess.run(["gcc", f"-I{inc}", f"-I{inc}/internal", "-o", str(exe), str(c)],
                       check=True, capture_output=True)  # fmt: skip
        got = [int(x) for x in subprocess.run([str(exe)], capture_output=True, text=True,
                                              check=True).stdout.split()]  # fmt: skip
        want = [getattr(lay, a) for _s, _f, a in checks] + [lay.ascii_size, lay.compact_size]
        assert got == want, version


def test_stack_keys_round_trip() -> None:
    native = np.array([5, -1, 7, -1, -17], dtype=np.int32)
    py = np.array([-1, 3, 9, -1, 0], dtype=np.int32)
    keys = stack_keys(native, py)
    assert keys.tolist() == [5, (4 << 32) | NO_NATIVE, (10 << 32) | 7, -1, (1 << 32) | NO_NATIVE]
    assert [split_key(k) for k in keys.tolist() if k >= 0] == [(5, -1), (-1, 3), (7, 9), (-1, 0)]


def test_merge_replaces_eval_frames_innermost_first() -> None:
    def nat(sym: str) -> dict[str, object]:
        return {"pid": 1, "stack_id": 0, "depth": 0, "ip": 1, "module": "m", "offset": 1,
                "symbol": sym}

    native = [nat("cuMemAlloc_v2"), nat("ffi_call"), nat("_PyEval_EvalFrameDefault"),
              nat("PyObject_Call"), nat("_PyEval_EvalFrameDefault"), nat("main")]
    python = [("a", "f.py", 3, 0x10, 4, False), ("b", "f.py", 5, 0x20, 8, True),
              ("c", "g.py", 7, 0x30, 2, True), ("d", "h.py", 9, 0x40, 0, True)]
    rows = merge(1, 99, native, python)
    got = [(r["kind"], r["symbol"] or r["function"]) for r in rows]
    assert got == [("native", "cuMemAlloc_v2"), ("native", "ffi_call"), ("python", "a"),
                   ("python", "b"), ("native", "PyObject_Call"), ("python", "c"),
                   ("native", "main"), ("python", "d")]
    assert [r["depth"] for r in rows] == list(range(8))
    assert {r["stack_id"] for r in rows} == {99}
    assert rows[2]["filename"] == "f.py" and rows[2]["line"] == 3 and rows[2]["offset"] == 4


FORGED = """
import sys, types
def inner():
    sys.stdout.write("R\\n"); sys.stdout.flush(); sys.stdin.readline()
size = int(sys.argv[1])
if sys.version_info >= (3, 11):
    # one kind-13 entry whose line-delta varint runs on for the whole table
    table = bytes([0x80 | 13 << 3]) + b"\\x7f" * (size - 2) + b"\\x00"
else:
    table = bytes([2, 1]) * (size // 2)  # 3.10: a new line every instruction
types.FunctionType(inner.__code__.replace(co_linetable=table), globals())()
"""


def _forged_process(exe: Path, size: int) -> tuple[subprocess.Popen[bytes], process.PyProcess]:
    proc = subprocess.Popen([str(exe), "-c", FORGED, str(size)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)  # fmt: skip
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"R\n"
    try:
        return proc, process.find(proc.pid)
    except (PermissionError, process.NotPython) as e:
        proc.kill()
        pytest.skip(f"process memory not readable here: {e}")


@pytest.mark.parametrize("exe", [INTERPRETERS[(3, 10)], INTERPRETERS[(3, 12)]],
                         ids=["3.10", "3.12"])
def test_forged_line_table_costs_one_bounded_decode(exe: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A real process whose running function carries a forged line table of
    MAX_TABLE bytes (a varint that never ends, 3.11+; a new line per instruction,
    3.10): its frame is named, decoded once per code object in bounded time (the
    varint decoder was quadratic: 47 s a lookup), and every later lookup is a
    binary search."""
    import time

    from gputrace.record import python_stacks

    if not exe.exists():
        pytest.skip(f"{exe} not installed")
    proc, p = _forged_process(exe, pycode.MAX_TABLE)
    decodes: list[int] = []
    real = pycode.decode_lines

    def counted(table: bytes, first: int, version: tuple[int, int]) -> pycode.Lines:
        decodes.append(len(table))
        return real(table, first, version)

    monkeypatch.setattr(pycode, "decode_lines", counted)
    try:
        t0 = time.monotonic()
        frames = _walk(p)  # reads and decodes each frame's code object
        first_s = time.monotonic() - t0
        ts = process._thread_states(p.mem, p.layout, p.runtime)[-1]
        frame = p.mem.u64(ts + p.layout.ts_frame)
        if p.layout.cframe_frame != layouts.NONE:
            frame = p.mem.u64(frame + p.layout.cframe_frame) if frame else 0
        code_addr = p.mem.u64(frame + p.layout.fr_code)
        assert code_addr is not None
        stacks = python_stacks.PythonStacks(None, None)
        decodes.clear()
        c1 = stacks._code(p, proc.pid, code_addr)
        c2 = stacks._code(p, proc.pid, code_addr)
        t0 = time.monotonic()
        for unit in range(0, 1 << 16, 7):
            pycode.line_of(c1, p.layout, c1.bytecode + 2 * unit if c1 else unit)
        lookups_s = time.monotonic() - t0
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()
        p.mem.close()
    assert c1 is not None and c1 is c2 and decodes == [pycode.MAX_TABLE]
    assert len(c1.linetable) == pycode.MAX_TABLE
    assert frames[0][0] == "inner" and frames[-1][0] == "<module>"
    if p.layout.version >= (3, 11):
        assert frames[0][1] is None  # the forged varint ends the table: no line
        assert stacks.table_left[proc.pid] == pycode.PROCESS_TABLES - pycode.MAX_TABLE
    # bounds with room for a loaded 2-core host; the quadratic decoder took 47 s
    assert first_s < 5.0 and lookups_s < 1.0, (first_s, lookups_s)


def test_line_table_over_the_bound_is_not_read() -> None:
    """A table one byte over MAX_TABLE is not read from the process at all: the
    frame keeps its name, without a line."""
    exe = INTERPRETERS[(3, 12)]
    if not exe.exists():
        pytest.skip(f"{exe} not installed")
    proc, p = _forged_process(exe, pycode.MAX_TABLE + 1)
    try:
        frames = _walk(p)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()
        p.mem.close()
    assert frames[0] == ("inner", None, False)


@pytest.mark.parametrize("version", list(INTERPRETERS), ids=lambda v: "{}.{}".format(*v))
def test_line_tables_of_a_whole_module_match_co_lines(version: tuple[int, int]) -> None:
    """Every code object of a real module (argparse: comprehensions, nested
    functions, long tables) decodes to the lines CPython's co_lines gives."""
    exe = INTERPRETERS[version]
    if not exe.exists():
        pytest.skip(f"{exe} not installed")
    dump = ("import argparse, json, types\n"
            "todo, out = [compile(open(argparse.__file__).read(), 'a.py', 'exec')], []\n"
            "while todo:\n"
            "    c = todo.pop()\n"
            "    todo += [k for k in c.co_consts if isinstance(k, types.CodeType)]\n"
            "    out.append([c.co_linetable.hex(), c.co_firstlineno, list(c.co_lines())])\n"
            "print(json.dumps(out))\n")
    codes = json.loads(subprocess.run([str(exe), "-c", dump], capture_output=True, text=True,
                                      check=True).stdout)  # fmt: skip
    lay = layouts.TABLES.get(version, layouts.PY312)
    checked = 0
    for table_hex, first, lines in codes:
        table = bytes.fromhex(table_hex)
        code = pycode.Code("f", "a.py", first, table, 0x1000,
                           pycode.decode_lines(table, first, version))
        for start, end, line in lines:
            for off in range(start, end, 2):
                instr = off // 2 if version == (3, 10) else 0x1000 + off
                assert pycode.line_of(code, lay, instr) == line, (off, line)
                checked += 1
    assert len(codes) > 100 and checked > 5000
