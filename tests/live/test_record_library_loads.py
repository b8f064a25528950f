"""Which hooks see libcuda loads (root, bcc, FUSE). With tp_btf the syscall
layer's sys_enter/sys_exit dispatcher sees them for the API layer, so no
syscalls:* tracepoint stays attached (each one makes every syscall of the host
take the kernel's per-syscall perf path); with tracepoints, or the API layer
alone, the API program keeps its own openat tracepoints."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from gputrace.record import loader
from tests.record_helpers import DLOPEN_TWIN_GROUP, live_skip_reason, record_dlopen_twin

pytestmark = [pytest.mark.live]
_SKIP = live_skip_reason()
if _SKIP is not None:
    pytestmark.append(pytest.mark.skip(reason=_SKIP))


def _syscall_tps(bpf: Any) -> list[str]:
    names = (tp.decode() if isinstance(tp, bytes) else str(tp) for tp in bpf.tracepoint_fds)
    return sorted(n for n in names if n.startswith("syscalls:"))


@pytest.mark.parametrize("mech", ["tp_btf", "tracepoint"])
def test_library_loads_seen_by(mech: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process: the syscall program and the API program loaded as `record`
    loads them. tp_btf: one set of shared maps (same kernel map ids), no
    syscalls:* tracepoint in either; tracepoint: the API program has its own
    maps and its openat pair."""
    from gputrace.record import loader, options
    from gputrace.record.api import libcuda as cuda

    monkeypatch.setenv(loader.HOOKS_ENV, mech)
    source, flags, _drv, _plan = options.build_program(options.Options(output=str(tmp_path)))
    probes = loader.Probes(source, flags)
    try:
        assert probes.hooks["mechanism"] == mech
        api = cuda.LibcudaProbes(None, probes)
        try:
            if mech == "tp_btf":
                assert api.library_loads == cuda.LOADS_TP_BTF
                assert probes.cuda_maps == loader.CUDA_SHARED_MAPS
                for n in loader.CUDA_SHARED_MAPS:
                    ours = loader.map_id(api.bpf[n].map_fd)
                    assert ours is not None and ours == loader.map_id(probes.bpf[n].map_fd)
                assert _syscall_tps(api.bpf) == [] and _syscall_tps(probes.bpf) == []
            else:
                assert api.library_loads == cuda.LOADS_TRACEPOINT
                assert probes.cuda_maps == ()
                with pytest.raises(KeyError):
                    probes.bpf[b"cuda_paused"]
                assert _syscall_tps(api.bpf) == [
                    "syscalls:sys_enter_openat", "syscalls:sys_exit_openat"]  # fmt: skip
                assert "syscalls:sys_enter_ioctl" in _syscall_tps(probes.bpf)
            assert api.manifest()["library_loads"] == api.library_loads
        finally:
            api.close()
    finally:
        probes.close()


@pytest.mark.parametrize("mech", [
    pytest.param(m, marks=[pytest.mark.xdist_group(DLOPEN_TWIN_GROUP)]
                 if m == loader.HOOKS_DEFAULT else [])
    for m in ("tp_btf", "tracepoint")])  # fmt: skip
def test_dlopen_pause_per_mechanism(mech: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    request: pytest.FixtureRequest) -> None:  # fmt: skip
    """The twin dlopen()s libcuda after the recorder is ready: whichever program
    sees the openat stops it, the recorder attaches, and every call is seen. The
    default mechanism's case asserts on the default-options recording the API layer's
    dlopen test shares (tests/live/conftest.py `dlopen_twin`), unless the environment
    already chooses a mechanism."""
    from gputrace.record.api import libcuda as cuda
    from tests.live.test_record_api import _check_calls

    if mech == loader.HOOKS_DEFAULT and loader.HOOKS_ENV not in os.environ:
        t = request.getfixturevalue("dlopen_twin")
    else:
        monkeypatch.setenv(loader.HOOKS_ENV, mech)
        t = record_dlopen_twin(tmp_path / "trace")
    assert t.manifest["syscall_hooks"]["mechanism"] == mech
    want = cuda.LOADS_TP_BTF if mech == "tp_btf" else cuda.LOADS_TRACEPOINT
    assert t.manifest["api"]["library_loads"] == want
    assert t.manifest["api"]["pauses"] >= 1
    _check_calls(t.scan("cuda_calls").collect())
