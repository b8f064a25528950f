"""Symbols of modules without .symtab: taken from their build-id debug file
(DEBUG_ROOT/.build-id/xx/yyyy.debug) when one is installed, and C++ names
demangled. The truth: the stand-in caching allocator, stripped, with its
static grow_segment (in .symtab only) at the address nm gave before stripping."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from gputrace.record import elf
from gputrace.record.api import symbolize
from tests.standin_cuda.standin_cuda import build, skip_reason

pytestmark = pytest.mark.skipif(
    skip_reason() is not None or shutil.which("objcopy") is None, reason="gcc/binutils missing"
)


def _address(path: Path, name: str) -> int:
    out = subprocess.run(["nm", str(path)], check=True, capture_output=True, text=True).stdout
    return next(int(f[0], 16) for f in (ln.split() for ln in out.splitlines()) if f[-1] == name)


def test_stripped_module_takes_the_symbols_of_its_debug_file(tmp_path: Path) -> None:
    lib = build().lib_dir / "libcaching_standin.so"
    grow = _address(lib, "grow_segment")
    stripped, debug = tmp_path / "lib.so", tmp_path / "lib.debug"
    subprocess.run(["objcopy", "--only-keep-debug", str(lib), str(debug)], check=True)
    subprocess.run(["objcopy", "--strip-all", str(lib), str(stripped)], check=True)
    bare = elf.read(str(stripped))
    assert not bare.has_symtab and bare.symbol(grow + 1) is None  # static: not in .dynsym
    assert bare.build_id == elf.read(str(lib)).build_id and len(bare.build_id) == 40
    # not installed: the module stays as it is
    assert symbolize.with_debug_symbols(bare, str(tmp_path)).symbol(grow + 1) is None
    where = tmp_path / ".build-id" / bare.build_id[:2] / f"{bare.build_id[2:]}.debug"
    where.parent.mkdir(parents=True)
    shutil.copy(debug, where)
    assert symbolize.debug_file(bare.build_id, str(tmp_path)) == str(where)
    mod = symbolize.with_debug_symbols(elf.read(str(stripped)), str(tmp_path))
    assert mod.symbol(grow + 1) == "grow_segment"
    assert mod.symbol(_address(lib, "cache_alloc")) == "cache_alloc"


@pytest.mark.skipif(shutil.which("c++filt") is None, reason="c++filt missing")
def test_cxx_names_are_demangled_and_others_kept() -> None:
    assert (
        symbolize.demangle("_ZN3c104cuda9allocatorEPvm")
        == "c10::cuda::allocator(void*, unsigned long)"
    )
    assert symbolize.demangle("cuMemAlloc_v2") == "cuMemAlloc_v2"
    assert symbolize.demangle("_Znot a name") == "_Znot a name"
