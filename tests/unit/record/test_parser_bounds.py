"""The recorder's parsers of files a traced process chooses are bounded by design
(docs/security.md, "ELF files" and "Unwind tables"): hostile ELF files built here
(tests/hostile_elf.py, SYNTHETIC) are parsed by real processes, a child that runs the
recorder's symbol reader under an address-space limit, and the recorder's own compile
worker (`tables.Compiler`), and each is refused or cut within the stated memory and
time, where the unbounded parsers took gigabytes and minutes:

- a symbol-name bomb (1,000 names pointing into one NUL-free 8 MiB string table:
  ~8 GiB sliced) reads at most MAX_NAME_BYTES a name; 4,000 of them are refused;
- an FDE of 2 million rows (65 s and 1.97 GiB in the worker), a million CIEs (244 s,
  1.6 GiB) and a 1 GiB .eh_frame (read whole into memory) are refused in seconds;
- a refusal is kept by the cache; the worker's address space is capped;
- a library's cache key and its rows come from one descriptor (a symlink flipped
  between the two put one file's rows under another's key);
- the cache directory is refused when any directory on its path is another user's.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gputrace.record import elf
from gputrace.record.unwind import cache, cfi, tables
from tests import hostile_elf

ROOT = Path(__file__).resolve().parents[3]
CHILD_AS = 1 << 30  # the child parser's address space: the old parser needed ~8 GiB
MAX_RSS = 300 << 20  # peak resident memory allowed a parse of a bomb
# peaks are read from VmHWM in the child: ru_maxrss survives exec, so a child forked
# from a large pytest worker would start at the worker's resident size
MAX_S = 20.0  # wall time allowed (2 shared CPUs); the old parsers took minutes


def parse_in_child(code: str, *args: str) -> dict[str, object]:
    """Run `code` (which prints a JSON object) in a child python limited to CHILD_AS;
    its answer with its peak RSS (bytes) and wall time added."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (CHILD_AS, CHILD_AS))

    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                       timeout=300, preexec_fn=limit, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    wall = time.monotonic() - t0
    assert r.returncode == 0, r.stderr[-2000:]
    out: dict[str, object] = json.loads(r.stdout)
    out["wall"] = wall
    return out


READ = """
import json, resource, sys
from gputrace.record import elf
try:
    e = elf.read(sys.argv[1])
    got = {"names": len(e.names), "longest": max(map(len, e.names), default=0),
           "exported": len(e.exported)}
except elf.ElfError as err:
    got = {"error": str(err)}
hwm = [ln for ln in open("/proc/self/status") if ln.startswith("VmHWM")]
got["rss"] = int(hwm[0].split()[1]) * 1024
print(json.dumps(got))
"""


def test_a_symbol_name_bomb_is_read_with_bounded_names(tmp_path: Path) -> None:
    lib = hostile_elf.symbol_bomb(tmp_path / "libcuda.so.1", symbols=1000, strtab=8 << 20)
    got = parse_in_child(READ, str(lib))
    assert "error" not in got, got
    assert got["names"] == 1000 and got["exported"] == 1  # all cut to the same 16 KiB of "A"
    assert got["longest"] == elf.MAX_NAME_BYTES  # cut, not sliced to the end of the file
    assert int(got["rss"]) < MAX_RSS, got  # type: ignore[call-overload]
    assert float(got["wall"]) < MAX_S, got  # type: ignore[arg-type]


def test_names_beyond_the_string_tables_size_are_refused(tmp_path: Path) -> None:
    lib = hostile_elf.symbol_bomb(tmp_path / "libcuda.so.1", symbols=4000, strtab=8 << 20)
    got = parse_in_child(READ, str(lib))
    assert "symbol names over" in str(got.get("error")), got
    assert "string tables of 8388608 bytes" in str(got["error"])
    assert int(got["rss"]) < MAX_RSS, got  # type: ignore[call-overload]


def test_a_file_over_the_size_bound_is_not_parsed(tmp_path: Path) -> None:
    lib = hostile_elf.symbol_bomb(tmp_path / "libbig.so", symbols=10, strtab=4096)
    with lib.open("r+b") as f:
        f.truncate(elf.MAX_FILE_BYTES + 1)  # sparse: no disk
    with pytest.raises(elf.ElfError, match=r"over the 4096 MiB bound \(not parsed\)"):
        elf.read(str(lib))


SYMBOLIZE = """
import json, resource, sys
from gputrace.record.api.symbolize import Symbolizer
pid, lib, link = int(sys.argv[1]), sys.argv[2], sys.argv[3]
sym = Symbolizer()
sym.refresh(pid)
[m] = [m for m in sym.maps[pid] if m.path == lib]
rows = sym.stack_rows(pid, 1, [m.start + 0x1010])
print(json.dumps({"module": rows[0]["module"], "symbol": rows[0]["symbol"],
                  "skipped": sym.skipped, "link": sym._module(pid, link) is None,
                  "rss": int([ln for ln in open("/proc/self/status")
                              if ln.startswith("VmHWM")][0].split()[1]) * 1024}))
"""


def test_the_symbolizer_says_why_a_mapped_file_has_no_symbols(tmp_path: Path) -> None:
    """A traced process maps the refused bomb executable: its frames stay unresolved
    and the reason is kept for the manifest; a mapping whose name is now a symlink
    is not followed (the mapping's name is its resolved file)."""
    lib = hostile_elf.symbol_bomb(tmp_path / "libbomb.so", symbols=4000, strtab=8 << 20)
    link = tmp_path / "liblink.so"
    link.symlink_to(hostile_elf.symbol_bomb(tmp_path / "libok.so", 3, 64))
    code = ("import mmap, sys; f = open(sys.argv[1], 'rb'); "
            "m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ | mmap.PROT_EXEC); "
            "print('mapped', flush=True); sys.stdin.read()")  # fmt: skip
    p = subprocess.Popen([sys.executable, "-c", code, str(lib)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert p.stdout is not None and p.stdout.readline() == "mapped\n"
        got = parse_in_child(SYMBOLIZE, str(p.pid), str(lib), str(link))
    finally:
        p.kill()
        p.wait()
    assert got["module"] == str(lib) and got["symbol"] is None
    assert "symbol names over" in got["skipped"][str(lib)]  # type: ignore[index]
    assert got["link"] is True  # O_NOFOLLOW
    assert int(got["rss"]) < MAX_RSS, got  # type: ignore[call-overload]
    assert float(got["wall"]) < MAX_S, got  # type: ignore[arg-type]


# ------------------------------------------------------------------ unwind tables
def worker_pid(c: tables.Compiler) -> int:
    assert c.pool is not None
    [proc] = list(c.pool._processes.values())  # type: ignore[attr-defined]
    return int(proc.pid)


def status_bytes(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(field)


@pytest.fixture
def compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tables.Compiler:
    pytest.importorskip("elftools")
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the spawned worker imports this tree
    c = tables.Compiler()
    c.start()
    yield c
    c.close()


@pytest.mark.parametrize("bomb, reason", [
    ("row_bomb", r"an entry of 60000\d\d bytes at offset 24, over the bound of 65536 bytes"),
    ("cie_bomb", r"more than 8192 CIEs, over the bound"),
    ("sparse_eh_frame", r"more than 65536 unwind rows, over the bound"),
])  # fmt: skip
def test_an_unwind_bomb_is_refused_in_bounded_time_and_memory(
        compiler: tables.Compiler, tmp_path: Path, bomb: str, reason: str) -> None:
    lib = getattr(hostile_elf, bomb)(tmp_path / f"lib{bomb}.so")
    t0 = time.monotonic()
    with pytest.raises(cfi.CfiError, match=reason):
        compiler.submit(str(lib)).result(timeout=120)
    assert time.monotonic() - t0 < MAX_S
    pid = worker_pid(compiler)
    assert status_bytes(pid, "VmHWM") < MAX_RSS
    # remembered: the refusal is kept, and the worker's memory is capped
    [entry] = [p for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")]
    assert cfi.BOUND in json.loads(entry.read_text())["error"]
    limits = Path(f"/proc/{pid}/limits").read_text()
    assert f"Max address space         {cfi.WORKER_MEMORY_BYTES}" in limits


def test_rows_are_counted_before_an_fde_is_decoded(tmp_path: Path) -> None:
    """An FDE under the entry bound whose rows pass the row bound is refused from its
    instructions, without decoding them."""
    pytest.importorskip("elftools")
    lib = hostile_elf.row_bomb(tmp_path / "librows.so", rows=20_000)  # 60 KB
    with pytest.raises(cfi.CfiError, match=r"more than 1000 unwind rows, over the bound "
                                           r"\(stopped after 0 functions"):
        cfi.compile_file(str(lib), 1000)
    assert len(cfi.compile_file(str(lib), 1 << 16).rows) > 20_000 // 15


def test_the_cache_keys_and_reads_one_descriptor(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The name is flipped (a directory symlink) after the library is opened: the
    rows kept under its identity are still its own."""
    pytest.importorskip("elftools")
    a, b, d = tmp_path / "a", tmp_path / "b", tmp_path / "cache"
    for folder, n in ((a, 100), (b, 3)):
        folder.mkdir()
        hostile_elf.honest(folder / "libz.so.1", functions=n)
    d.mkdir(mode=0o700)
    via = tmp_path / "via"
    via.symlink_to(a)
    real = cfi.compile_file

    def flip_then_compile(path: str, max_rows: int, fd: int | None = None) -> cfi.UnwindTable:
        via.unlink()
        via.symlink_to(b)  # the user's flip, between the open and the read
        return real(path, max_rows, fd) if fd is not None else real(path, max_rows)

    monkeypatch.setattr(cfi, "compile_file", flip_then_compile)
    got = cache.compile_cached(str(via / "libz.so.1"), 1 << 16, d)
    assert got.functions == 100
    kept = json.loads((d / cache.key(os.stat(a / "libz.so.1"), 1 << 16)).read_text())
    assert kept["functions"] == 100


def test_the_cache_directory_is_checked_along_its_whole_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parent = tmp_path / "user"
    parent.mkdir()
    monkeypatch.setenv(cache.CACHE_ENV, str(parent / "cache"))
    assert cache.cache_dir() == parent / "cache"  # root's, all the way
    if os.geteuid() == 0:
        os.chown(parent, 65534, 65534)  # a user's parent: it could rename cache away
        assert cache.cache_dir() is None
        os.chown(parent, 0, 0)
    parent.chmod(0o777)  # writable by all, not sticky
    assert cache.cache_dir() is None
    parent.chmod(0o1777)  # sticky, like /tmp: others cannot rename our entry
    assert cache.cache_dir() == parent / "cache"
    swapped = tmp_path / "link"
    swapped.symlink_to(parent)
    monkeypatch.setenv(cache.CACHE_ENV, str(swapped / "cache"))
    assert cache.cache_dir() is None


def test_the_worker_is_killed_and_reaped_whatever_it_does(compiler: tables.Compiler,
                                                          tmp_path: Path) -> None:
    from gputrace.record import reap

    pid = worker_pid(compiler)
    os.kill(pid, 19)  # SIGSTOP: a worker stopped mid-compile still ends
    compiler.close()
    assert reap.state(pid) is None
    assert reap.take_left() == []
    assert compiler.submit("/x").exception() is not None  # no worker started again
    assert compiler.pool is None


def test_a_dead_worker_is_replaced(compiler: tables.Compiler, tmp_path: Path) -> None:
    """A worker that died (past its memory cap, or killed) fails the compiles it had,
    and the next library gets a new worker, the old one reaped."""
    from concurrent.futures.process import BrokenProcessPool

    from gputrace.record import reap

    honest = hostile_elf.honest(tmp_path / "libhonest.so", functions=10)
    old = worker_pid(compiler)
    os.kill(old, 9)
    deadline = time.monotonic() + MAX_S
    while True:  # the pool notices the death on its own thread: a compile may still fail
        try:
            table = compiler.submit(str(honest)).result(timeout=60)
            break
        except BrokenProcessPool:
            assert time.monotonic() < deadline
    assert table.functions == 10
    assert worker_pid(compiler) != old and reap.state(old) is None


# ------------------------------------------------------------------ Python interpreters
FIND = """
import json, sys
from gputrace.record.python_stacks import process
try:
    process.find(int(sys.argv[1]))
    got = {"found": True}
except process.NotPython:
    got = {"found": False}
got["rss"] = int([ln for ln in open("/proc/self/status")
                  if ln.startswith("VmHWM")][0].split()[1]) * 1024
print(json.dumps(got))
"""


MAPPER = r"""
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int fd = open(argv[1], O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) || mmap(0, st.st_size, PROT_READ | PROT_EXEC, MAP_PRIVATE,
                                         fd, 0) == MAP_FAILED)
        return 1;
    printf("mapped\n");
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {}
    return 0;
}
"""


def mapper(tmp_path: Path) -> Path:
    """A C program that maps its argument executable (no CPython of its own)."""
    src, exe = tmp_path / "mapper.c", tmp_path / "mapper"
    src.write_text(MAPPER)
    r = subprocess.run(["cc", "-O0", "-o", str(exe), str(src)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"no C compiler: {r.stderr[-200:]}")
    return exe


def sparse_interpreter(path: Path) -> Path:
    """A well-formed ELF header followed by 8 GiB of holes (no disk)."""
    hostile_elf.symbol_bomb(path, symbols=3, strtab=64)
    with path.open("r+b") as f:
        f.truncate(8 << 30)
    return path


@pytest.mark.parametrize("build", [
    sparse_interpreter,  # was read whole: 8 GiB in the recorder
    lambda p: hostile_elf.symbol_bomb(p, symbols=4000, strtab=8 << 20),  # 32 GiB sliced
])  # fmt: skip
def test_a_file_mapped_under_an_interpreters_name_is_read_within_bounds(
        tmp_path: Path, build: object) -> None:
    """A traced process maps a hostile file named like libpython: the recorder's search
    for its CPython reads it within MAX_INTERPRETER_BYTES and compares names without
    slicing them, in bounded memory and time, and finds no interpreter."""
    from gputrace.record.python_stacks import process

    lib = build(tmp_path / "libpython3.11.so.1.0")  # type: ignore[operator]
    assert process.INTERPRETER_NAME.match(lib.name)
    p = subprocess.Popen([str(mapper(tmp_path)), str(lib)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert p.stdout is not None and p.stdout.readline() == "mapped\n"
        got = parse_in_child(FIND, str(p.pid))
    finally:
        p.kill()
        p.wait()
    assert got["found"] is False
    assert int(got["rss"]) < MAX_RSS, got  # type: ignore[call-overload]
    assert float(got["wall"]) < MAX_S, got  # type: ignore[arg-type]


def test_an_interpreter_name_that_is_a_fifo_is_not_waited_on(tmp_path: Path) -> None:
    """Between the maps read and the open, a process can put a FIFO at its mapping's
    name: opening it for reading would wait for a writer forever."""
    from gputrace.record.python_stacks import process

    fifo = tmp_path / "libpython3.11.so"
    os.mkfifo(fifo)
    code = ("import sys; from gputrace.record.python_stacks import process\n"
            "try:\n    process.elf_objects(sys.argv[1])\n"
            "except ValueError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True,
                       text=True, timeout=MAX_S, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert r.stdout == "not a regular file\n", r.stderr
    assert process.MAX_INTERPRETER_BYTES < CHILD_AS


def test_a_fifo_where_a_library_is_looked_for_is_not_waited_on(tmp_path: Path) -> None:
    """The libcuda attach, the symbolizer and the unwind cache open a name a traced
    process chose; a FIFO there (no writer) is refused at once, never waited on."""
    fifo = tmp_path / "libcuda.so.1"
    os.mkfifo(fifo)
    code = ("import sys; from gputrace.record import elf\n"
            "from gputrace.record.unwind import cache, cfi\n"
            "for nofollow in (False, True):\n"
            "    try:\n        elf.read(sys.argv[1], nofollow=nofollow)\n"
            "    except elf.ElfError as e:\n        print(e)\n"
            "try:\n    cache.compile_cached(sys.argv[1], 1000, None)\n"
            "except cfi.CfiError as e:\n    print(e)\n")  # fmt: skip
    r = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True,
                       text=True, timeout=MAX_S, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert r.stdout == f"{fifo}: not a regular file\n" * 3, r.stderr


TRUNCATE = """
import os, subprocess, sys, time
from gputrace.record import elf
path = sys.argv[1]
real = elf._parse

def parse_once_cut(p, d, symbols):
    # the traced process cuts its file short while the recorder parses it
    t = subprocess.Popen([sys.executable, "-c",
                          "import os, sys; os.truncate(sys.argv[1], 4096)", path])
    while t.poll() is None:  # it has cut, or it waits in truncate(2) (syscall 76)
        try:
            if open(f"/proc/{t.pid}/syscall").read().startswith("76 "):
                break
        except OSError:
            pass
        time.sleep(0.001)
    out = real(p, d, symbols)
    print("cut before the end of the parse:", t.poll() is not None, flush=True)
    return out

elf._parse = parse_once_cut
e = elf.read(path)
print("parsed", len(e.names), flush=True)
"""


def test_a_library_cut_short_under_the_parse_does_not_end_the_recorder(
        tmp_path: Path) -> None:
    """The symbolizer and the libcuda attach parse a traced process's file through a
    mapping; the process truncating it meanwhile made the next page read SIGBUS, which
    ends the (root) recorder. With the parse's read lease the truncate waits."""
    lib = hostile_elf.symbol_bomb(tmp_path / "libcut.so", symbols=1000, strtab=4 << 20)
    r = subprocess.run([sys.executable, "-c", TRUNCATE, str(lib)], capture_output=True,
                       text=True, timeout=120, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr[-2000:])  # -7: SIGBUS
    assert r.stdout == "cut before the end of the parse: False\nparsed 1000\n"
    assert lib.stat().st_size == 4096  # then it was cut, once the parse let go


def test_a_library_open_for_writing_is_not_parsed(tmp_path: Path) -> None:
    lib = hostile_elf.symbol_bomb(tmp_path / "libopen.so", symbols=10, strtab=4096)
    with lib.open("r+b"), pytest.raises(elf.ElfError, match=r"open for writing by a process"):
        elf.read(str(lib))
    assert len(elf.read(str(lib)).names) == 10
