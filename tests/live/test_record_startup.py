"""Start-up from the BPF object cache (gputrace/record/bpf_cache.py), live: a program
that allocates as soon as it runs loses no call, with its stack, whether the
recording compiled its programs (cold cache) or loaded them (warm); an entry that
was changed on disk is compiled again and rewritten, never loaded."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from tests.record_helpers import live_skip_reason, record_alloc_stacks

pytestmark = [pytest.mark.live]
_SKIP = live_skip_reason()
if _SKIP is not None:
    pytestmark.append(pytest.mark.skip(reason=_SKIP))

HERE = Path(__file__).resolve().parent.parent / "standin_cuda"
CALLS = 64  # first_ms.c's N
SIZES = sorted((i + 1) << 12 for i in range(CALLS))
CACHED_NOW, CACHE = "compiled (cached now)", "cache"


def _record(out: Path, exe: Path) -> dict[str, str]:
    """Record first_ms; check every call, its size and its stack down to main;
    return where each program came from (manifest recorder.bpf_objects)."""
    t, stacks, stdout = record_alloc_stacks(out, ["--", str(exe)], CALLS, ("symbol",), 600)
    assert stdout.startswith("ELAPSED_NS ")
    calls = t.scan("cuda_calls").collect()
    got = sorted(calls.filter(calls["func"] == "cuMemAlloc_v2")["size_bytes"].to_list())
    assert got == SIZES
    assert calls.filter(calls["func"] == "cuMemFree_v2").height == CALLS
    for frames in stacks:
        syms = [f[0] for f in frames]
        assert "alloc_now" in syms and "main" in syms, syms
    return dict(t.manifest["recorder"]["bpf_objects"])


def _entries(cache: Path) -> dict[str, Path]:
    return {json.loads(p.read_bytes())["what"]: p for p in cache.glob("*.bpfobj.json")}


def test_first_millisecond_cold_warm_and_tampered(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.standin_cuda.standin_cuda import StandinCudaUnavailable, link_program

    try:
        exe = link_program(HERE / "first_ms.c", tmp_path / "first_ms")
    except StandinCudaUnavailable as e:
        pytest.skip(str(e))
    cache = tmp_path / "bpf-cache"
    monkeypatch.setenv("GPUTRACE_BPF_CACHE", str(cache))
    monkeypatch.delenv("GPUTRACE_SYSCALL_HOOKS", raising=False)  # tracepoints: cacheable
    both = ("syscall-layer", "api-layer")

    assert _record(tmp_path / "cold", exe) == dict.fromkeys(both, CACHED_NOW)
    entries = _entries(cache)
    assert set(entries) == set(both)
    assert os.stat(cache).st_mode & 0o777 == 0o700
    assert _record(tmp_path / "warm", exe) == dict.fromkeys(both, CACHE)

    # syscall entry: one instruction byte changed (its digest no longer matches);
    # api entry: a map reference out of range, digest made to match (Entry.check)
    doc = json.loads(entries["syscall-layer"].read_bytes())
    name, b64 = next(iter(doc["entry"]["functions"].items()))
    raw = bytearray(base64.b64decode(b64))
    raw[-8] ^= 0x01
    doc["entry"]["functions"][name] = base64.b64encode(bytes(raw)).decode()
    entries["syscall-layer"].write_text(json.dumps(doc))
    doc = json.loads(entries["api-layer"].read_bytes())
    for fname, b64 in doc["entry"]["functions"].items():
        raw = bytearray(base64.b64decode(b64))
        at = next((i for i in range(0, len(raw), 8) if raw[i] == 0x18 and raw[i + 1] >> 4 == 1),
                  None)  # fmt: skip
        if at is not None:
            raw[at + 4 : at + 8] = (10_000).to_bytes(4, "little")
            doc["entry"]["functions"][fname] = base64.b64encode(bytes(raw)).decode()
            break
    from gputrace.record import bpf_cache

    doc["sha256"] = bpf_cache._digest(doc["entry"])
    entries["api-layer"].write_text(json.dumps(doc))
    for p in entries.values():
        assert bpf_cache.read(cache, p.name.removesuffix(".bpfobj.json")) is None

    assert _record(tmp_path / "tampered", exe) == dict.fromkeys(both, CACHED_NOW)
    for p in _entries(cache).values():  # rewritten sound
        assert bpf_cache.read(cache, p.name.removesuffix(".bpfobj.json")) is not None
