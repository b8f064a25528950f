"""How a recording starts fast: the BPF programs it will load compiled into the
cache all at once (each in its own process) when they are missing, and the API
layer loaded in a thread beside the syscall layer when they share nothing (the
kernel's verifier, most of a warm start, runs in the thread that loads).

`--no-cache` (`Caches`) turns both caches off for one recording.
benchmarks/README.md "Start-up" has the measurements.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import TYPE_CHECKING, Any

from gputrace.record import bpf_cache, loader
from gputrace.record.layer import Layer
from gputrace.record.unwind import cache as unwind_cache

if TYPE_CHECKING:
    from gputrace.record.session import Session


class Caches:
    """While a recording runs with `--no-cache`, the BPF object and unwind-table
    caches are "off" (their variables in this process's environment, which the
    unwind compile worker inherits); `close` puts them back."""

    def __init__(self, off: bool) -> None:
        bpf_cache.used.clear()  # this recording's programs only
        bpf_cache.fresh.clear()
        self._saved: dict[str, str | None] = {}
        if off:
            for var in (bpf_cache.CACHE_ENV, unwind_cache.CACHE_ENV):
                self._saved[var] = os.environ.get(var)
                os.environ[var] = "off"

    def close(self) -> None:
        for var, value in self._saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value
        self._saved.clear()


class Ahead:
    """Layers being built in threads, taken in RECORDER_LAYERS order by the recorder."""

    def __init__(self) -> None:
        self._threads: dict[type[Layer], threading.Thread] = {}
        self._built: dict[type[Layer], Layer | None] = {}
        self._errors: dict[type[Layer], BaseException] = {}

    def start(self, cls: type[Layer], s: Session, prepared: Any) -> None:
        def build() -> None:
            try:
                self._built[cls] = cls.build(s, prepared)
            except BaseException as e:
                self._errors[cls] = e

        t = threading.Thread(target=build, name=f"gputrace-build-{cls.name}", daemon=True)
        self._threads[cls] = t
        t.start()

    def has(self, cls: type[Layer]) -> bool:
        return cls in self._threads

    def result(self, cls: type[Layer]) -> Layer | None:
        """The layer built in its thread (waits for it); its error, raised here."""
        self._threads.pop(cls).join()
        if cls in self._errors:
            raise self._errors.pop(cls)
        return self._built.pop(cls)

    def leftover(self) -> list[Layer]:
        """Layers built but never taken (an earlier layer failed); waits for them."""
        for t in self._threads.values():
            t.join()
        self._threads.clear()
        out = [ly for ly in self._built.values() if ly is not None]
        self._built.clear()
        return out


def prepare(s: Session, prepared: dict[str, Any]) -> Ahead:
    """Compile the missing cache entries of the recording's programs at once, then
    start the API layer's build beside the syscall layer's where that is safe."""
    from gputrace.record.api import libcuda
    from gputrace.record.api.layer import ApiLayer

    loader.import_bcc()  # once, here: the layers' threads would race to find it
    tracepoints = os.environ.get(loader.HOOKS_ENV, loader.HOOKS_DEFAULT) == "tracepoint"
    programs = [(*libcuda.program(s.opts.stack_depth, tuple(s.api_extensions)), "api-layer")]
    if tracepoints:  # else the syscall program is compiled with tp_btf flags first
        programs.insert(0, (*s.program, "syscall-layer"))
    d = bpf_cache.cache_dir()
    if d is not None:
        bpf_cache.compile_entries(d, programs)
    ahead = Ahead()
    if d is not None and tracepoints:
        # the API layer shares maps only with a tp_btf syscall program (s.probes unused)
        ahead.start(ApiLayer, s, prepared.get(ApiLayer.name))
    return ahead


def build_layers(s: Session, prepared: dict[str, Any], out: list[Layer],
                 layers: tuple[type[Layer], ...]) -> None:
    """Load each layer's programs, appending the layers to `out` in RECORDER_LAYERS
    order. Their missing cache entries are compiled first, all at once (`prepare`);
    with the syscall probes on tracepoints the API layer, which then shares nothing
    with them, loads in a thread beside them."""
    first = {cls: cls.build(s, prepared.get(cls.name)) for cls in layers if cls.builds_first}
    ahead = prepare(s, prepared)
    try:
        for cls in layers:
            if cls in first:
                layer = first[cls]
            elif ahead.has(cls):
                layer = ahead.result(cls)
            else:
                layer = cls.build(s, prepared.get(cls.name))
            if layer is not None:
                out.append(layer)
                s.decode_errors.update({b.counted_as: 0 for b in cls.BUFFERS.values()})
    finally:
        for layer in ahead.leftover():  # built beside a layer that failed
            with contextlib.suppress(Exception):
                layer.close(s)
