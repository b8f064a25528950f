"""Unwind tables kept across recordings (gputrace/record/unwind/cache.py): a second
compile of the same file reads the kept table (the same rows), a refusal that depends
on the file alone is kept and one that may not recur is not, a changed file is compiled
again, an entry that does not check is never trusted, and an unsafe or disabled
directory keeps nothing. Real compiles of the stand-in caching allocator
(tests/standin_cuda/caching_alloc.c, built without frame pointers)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from gputrace.record.unwind import cache, cfi
from tests.standin_cuda.standin_cuda import build, skip_reason

pytest.importorskip("elftools")
pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))
ROWS = 1 << 16


@pytest.fixture
def lib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    copy = tmp_path / "libcaching_standin.so"
    shutil.copy(build().lib_dir / "libcaching_standin.so", copy)
    return copy


def entries(tmp_path: Path) -> list[Path]:
    return sorted(p for p in (tmp_path / "cache").iterdir() if not p.name.startswith("."))


def no_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(path: str, max_rows: int, fd: int | None = None) -> cfi.UnwindTable:
        raise AssertionError("compiled although kept")

    monkeypatch.setattr(cfi, "compile_file", refuse)


def test_a_second_compile_reads_the_kept_table(lib: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    first = cache.compile_cached(str(lib), ROWS, cache.cache_dir())
    assert first == cfi.compile_file(str(lib), ROWS) and len(first.rows) > 10
    [entry] = entries(tmp_path)
    assert entry.stat().st_mode & 0o077 == 0 and (tmp_path / "cache").stat().st_mode & 0o077 == 0
    no_compile(monkeypatch)
    assert cache.compile_cached(str(lib), ROWS, cache.cache_dir()) == first


def test_a_changed_file_or_bound_is_compiled_again(lib: Path, tmp_path: Path) -> None:
    cache.compile_cached(str(lib), ROWS, cache.cache_dir())
    os.utime(lib, ns=(1, 1))  # another modification time: another file as far as we know
    cache.compile_cached(str(lib), ROWS, cache.cache_dir())
    cache.compile_cached(str(lib), ROWS // 2, cache.cache_dir())
    assert len(entries(tmp_path)) == 3


def test_refusals_kept_only_when_they_depend_on_the_file(
        lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(cfi.CfiError, match="more than 10 unwind rows"):
        cache.compile_cached(str(lib), 10, cache.cache_dir())
    assert len(entries(tmp_path)) == 1
    no_compile(monkeypatch)
    with pytest.raises(cfi.CfiError, match=f"^{lib}: more than 10 unwind rows"):
        cache.compile_cached(str(lib), 10, cache.cache_dir())
    # pyelftools missing is this environment's, not the file's: not kept
    def missing(path: str, max_rows: int, fd: int | None = None) -> cfi.UnwindTable:
        raise cfi.CfiError(f"{path}: pyelftools is not installed")

    monkeypatch.setattr(cfi, "compile_file", missing)
    with pytest.raises(cfi.CfiError, match="pyelftools"):
        cache.compile_cached(str(lib), 20, cache.cache_dir())
    assert len(entries(tmp_path)) == 1


@pytest.mark.parametrize("spoil", [
    lambda d: d.update(rows=list(reversed(d["rows"]))),  # out of order
    lambda d: d["rows"][0].__setitem__(2, 9),  # no such kind
    lambda d: d.update(functions="many"),
    lambda d: d.update(v=0),
    lambda d: d.clear(),
])
def test_an_entry_that_does_not_check_is_compiled_again(
        lib: Path, tmp_path: Path, spoil: object) -> None:
    want = cache.compile_cached(str(lib), ROWS, cache.cache_dir())
    [entry] = entries(tmp_path)
    doc = json.loads(entry.read_text())
    spoil(doc)  # type: ignore[operator]
    entry.write_text(json.dumps(doc))
    assert cache.compile_cached(str(lib), ROWS, cache.cache_dir()) == want
    assert json.loads(entry.read_text())["rows"] == [list(r.pack()) for r in want.rows]
    entry.write_text("{not json")
    assert cache.compile_cached(str(lib), ROWS, cache.cache_dir()) == want


def test_no_cache_when_off_or_unsafe(lib: Path, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cache.CACHE_ENV, "off")
    assert cache.cache_dir() is None
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)  # writable by others: anyone could plant a table
    monkeypatch.setenv(cache.CACHE_ENV, str(shared))
    assert cache.cache_dir() is None
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "cache")
    monkeypatch.setenv(cache.CACHE_ENV, str(link))
    (tmp_path / "cache").mkdir(mode=0o700)
    assert cache.cache_dir() is None  # a link is not followed
    got = cache.compile_cached(str(lib), ROWS, cache.cache_dir())
    assert got == cfi.compile_file(str(lib), ROWS)
    assert not any((tmp_path / "cache").iterdir())
