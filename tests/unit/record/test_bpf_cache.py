"""The BPF object cache's store (gputrace/record/bpf_cache.py, bpf_object.Entry), no
root or bcc needed: an entry written is read back equal; one changed on disk (a byte
of its instructions, its key, its version, a map reference out of range with a
matching digest, its mode) or of another program, kernel, bcc or header is never
read; an unsafe or disabled directory is not used; `--no-cache` turns both caches
off for one recording and puts them back. tests/live/test_record_startup.py loads
real entries."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import pytest

from gputrace.record import bpf_cache, startup
from gputrace.record.bpf_object import Entry, MapDesc
from gputrace.record.unwind import cache as unwind_cache

LD_MAP = bytes([0x18, 0x11, 0, 0]) + (1).to_bytes(4, "little") + bytes(8)  # r1 = map #1
EXIT = bytes([0x95]) + bytes(7)


def _entry() -> Entry:
    t = [MapDesc("config", 2, 4, 16, 1, 0, '"int"', '["cfg", [["a", "int"]], "struct"]'),
         MapDesc("events", 27, 0, 0, 4096, 0, '"int"', '"int"')]  # fmt: skip
    return Entry({"tracepoint__sched__x": LD_MAP + EXIT}, t, "GPL", 0)


@pytest.fixture
def cdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "bpf"
    monkeypatch.setenv(bpf_cache.CACHE_ENV, str(d))
    got = bpf_cache.cache_dir()
    assert got == d and os.stat(d).st_mode & 0o777 == 0o700
    return d


def _doc(d: Path, k: str) -> dict[str, Any]:
    return dict(json.loads((d / f"{k}.bpfobj.json").read_bytes()))


def _put(d: Path, k: str, doc: dict[str, Any]) -> None:
    (d / f"{k}.bpfobj.json").write_text(json.dumps(doc))


def test_written_entry_reads_back_equal(cdir: Path) -> None:
    k = bpf_cache.key("text", ["-DX=1"])
    assert bpf_cache.read(cdir, k) is None
    bpf_cache.write(cdir, k, _entry(), "syscall-layer")
    assert bpf_cache.read(cdir, k) == _entry()
    doc = _doc(cdir, k)
    assert doc["what"] == "syscall-layer" and doc["kernel"].startswith(os.uname().release)
    assert os.stat(cdir / f"{k}.bpfobj.json").st_mode & 0o077 == 0


@pytest.mark.parametrize("change", ["insn byte", "key", "version", "map index", "mode",
                                    "not json", "symlink"])  # fmt: skip
def test_changed_entry_is_never_read(cdir: Path, tmp_path: Path, change: str) -> None:
    k = bpf_cache.key("text", [])
    bpf_cache.write(cdir, k, _entry(), "x")
    path = cdir / f"{k}.bpfobj.json"
    doc = _doc(cdir, k)
    if change == "insn byte":
        raw = bytearray(base64.b64decode(doc["entry"]["functions"]["tracepoint__sched__x"]))
        raw[9] ^= 1
        doc["entry"]["functions"]["tracepoint__sched__x"] = base64.b64encode(raw).decode()
        _put(cdir, k, doc)
    elif change == "key":
        doc["key"] = bpf_cache.key("other text", [])
        _put(cdir, k, doc)
    elif change == "version":
        doc["v"] = bpf_cache.VERSION + 1
        _put(cdir, k, doc)
    elif change == "map index":  # digest recomputed: the entry's own check refuses it
        bad = LD_MAP[:4] + (2).to_bytes(4, "little") + LD_MAP[8:] + EXIT
        doc["entry"]["functions"]["tracepoint__sched__x"] = base64.b64encode(bad).decode()
        doc["sha256"] = bpf_cache._digest(doc["entry"])
        _put(cdir, k, doc)
    elif change == "mode":
        os.chmod(path, 0o666)
    elif change == "not json":
        path.write_bytes(path.read_bytes()[:-10])
    else:
        other = tmp_path / "elsewhere.json"
        other.write_bytes(path.read_bytes())
        path.unlink()
        path.symlink_to(other)
    assert bpf_cache.read(cdir, k) is None


def test_key_covers_text_flags_headers_and_host(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "gputrace_events.h").write_text("struct a { int x; };\n")
    flags = [f"-I{inc}", "-DN=1"]
    k = bpf_cache.key("t", flags)
    assert k == bpf_cache.key("t", list(flags))
    assert k != bpf_cache.key("t2", flags)
    assert k != bpf_cache.key("t", [f"-I{inc}", "-DN=2"])
    (inc / "gputrace_events.h").write_text("struct a { long x; };\n")
    k2 = bpf_cache.key("t", flags)
    assert k2 != k
    now = bpf_cache.host()
    for field in ("kernel", "bcc"):
        monkeypatch.setattr(bpf_cache, "host", lambda f=field: {**now, f: "other"})
        assert bpf_cache.key("t", flags) != k2


def test_unsafe_or_disabled_directory_is_not_used(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "shared"
    d.mkdir(mode=0o777)
    os.chmod(d, 0o777)
    monkeypatch.setenv(bpf_cache.CACHE_ENV, str(d))
    assert bpf_cache.cache_dir() is None
    assert bpf_cache.state()["state"].startswith("not used")
    monkeypatch.setenv(bpf_cache.CACHE_ENV, "off")
    assert bpf_cache.cache_dir() is None
    assert bpf_cache.state()["dir"] is None


def test_state_counts_entries_of_this_host(cdir: Path) -> None:
    bpf_cache.write(cdir, bpf_cache.key("a", []), _entry(), "a")
    bpf_cache.write(cdir, bpf_cache.key("b", []), _entry(), "b")
    k = bpf_cache.key("c", [])
    bpf_cache.write(cdir, k, _entry(), "c")
    doc = _doc(cdir, k)
    doc["bcc"] = "0.0.1"  # made by another bcc: kept on disk, never read again
    _put(cdir, k, doc)
    st = bpf_cache.state()
    assert (st["state"], st["entries"], st["current"]) == ("on", 3, 2)


def test_uncacheable_flags() -> None:
    assert bpf_cache.cacheable(["-DGT_X=1"])
    assert not bpf_cache.cacheable(["-DGT_TP_BTF", "-DGT_CUDA_SHARE"])
    assert not bpf_cache.cacheable(["-DGT_CUDA_EXTERN"])


def test_no_cache_turns_both_caches_off_for_one_recording(
        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv(bpf_cache.CACHE_ENV, "/somewhere")
    monkeypatch.delenv(unwind_cache.CACHE_ENV, raising=False)
    c = startup.Caches(off=True)
    assert os.environ[bpf_cache.CACHE_ENV] == os.environ[unwind_cache.CACHE_ENV] == "off"
    c.close()
    assert os.environ[bpf_cache.CACHE_ENV] == "/somewhere"
    assert unwind_cache.CACHE_ENV not in os.environ
    startup.Caches(off=False).close()
    assert os.environ[bpf_cache.CACHE_ENV] == "/somewhere"
