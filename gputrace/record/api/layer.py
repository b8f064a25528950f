"""The api layer: uprobes on libcuda's allocation calls, their own BPF object
(`gputrace/record/api/libcuda.py`; docs/record.md "The API layer")."""

from __future__ import annotations

import os
import sys
from typing import Any, ClassVar

from gputrace.record.api import decode as decode_cuda
from gputrace.record.api import discovery, watchdog
from gputrace.record.api import libcuda as cuda
from gputrace.record.layer import Batch, Buffer, Decoded, Due, Layer
from gputrace.record.oom_watch import OomWatch
from gputrace.record.session import Session


def _calls(layer: ApiLayer, _s: Session, _kind: str, data: bytes) -> Decoded:
    return layer.api.decode_calls(data)


class _WriterView:
    """What `cuda.LibcudaProbes.write` needs of a trace writer, with rows going
    through the session (observers, row counts)."""

    def __init__(self, s: Session) -> None:
        self.s = s

    @property
    def manifest(self) -> dict[str, Any]:
        return self.s.w.manifest

    def append(self, table: str, data: Batch) -> None:
        self.s.append(table, data)

    def update_manifest(self, **fields: Any) -> None:
        self.s.w.update_manifest(**fields)


class ApiLayer(Layer):
    name = "api"
    RECORDS: ClassVar[dict[str, tuple[str, ...]]] = {"api": ("uprobes",)}
    BUFFERS: ClassVar[dict[str, Buffer]] = {
        "api:cuda_calls": Buffer("cuda_calls", cuda.BUFFER, decode_cuda.CUDA_DTYPE, _calls),
    }

    def __init__(self, api: cuda.LibcudaProbes) -> None:
        self.api = api
        self.drops = {cuda.BUFFER: 0}
        self.oom: OomWatch | None = None

    @classmethod
    def validate(cls, opts: Any, prefix: str) -> Any:
        if opts.libcuda is not None:
            opts.libcuda = discovery.check_libcuda(opts.libcuda)
        return None

    @classmethod
    def build(cls, s: Session, prepared: Any) -> ApiLayer:
        # the syscall layer (built first) may see library loads for it (tp_btf)
        layer = cls(cuda.LibcudaProbes(s.opts.libcuda, s.probes, stack_depth=s.opts.stack_depth,
                                       extensions=tuple(s.api_extensions)))
        s.api = layer.api  # for the layers whose probes it holds (s.api_extensions)
        return layer

    @property
    def hooks(self) -> int:
        return self.api.count

    def configure(self, s: Session) -> None:
        if s.filtered:  # the API probe stops processes only in filter mode
            self.api.guard = watchdog.Watchdog(self.api.paused_map_fd)

    def attach(self, s: Session) -> None:
        self.api.configure(self_tgid=os.getpid(), filter_targets=s.filtered, pause=s.filtered)
        self.api.add_targets(s.targets)
        self.api.start(s.targets, s.filtered)
        try:  # CUDA_ERROR_OUT_OF_MEMORY heard at once; else from the decoded rows
            self.oom = OomWatch(self.api.bpf, s.incidents, "cuda_oom_events", self.api.names)
        except Exception as e:
            print(f"gputrace: warning: API-layer out-of-memory failures are noticed at decode "
                  f"time only ({type(e).__name__}: {e})", file=sys.stderr, flush=True)  # fmt: skip

    def drain(self, s: Session, due: Due) -> list[tuple[str, Any]]:
        items = self.api.drain()
        self._check_guard()
        if due is not Due.POLL:
            self.drops = self.api.drops()
        if due is Due.FINAL:  # ended before the last manifest: one left is said there
            self.api.unwind.close()
        return items

    def _check_guard(self) -> None:
        """A watchdog gone (someone killed it) protects nobody: stop pausing."""
        guard = self.api.guard
        if guard is not None and not guard.alive():
            self.api.guard = None
            self.api.configure(self_tgid=os.getpid(), filter_targets=True, pause=False)
            print("gputrace: warning: the watchdog process exited; processes that load "
                  "libcuda are no longer held until the API probes are attached",
                  file=sys.stderr, flush=True)  # fmt: skip

    def write(self, s: Session, kind: str, data: Any) -> None:
        self.api.write(kind, data, _WriterView(s))

    def manifest(self, s: Session, m: dict[str, Any]) -> dict[str, Any]:
        return {"drops": dict(self.drops)}

    def close(self, s: Session) -> None:
        if self.oom is not None:
            self.oom.close()
            self.oom = None
        self.api.close()
        if self.api.guard is not None:
            self.api.guard.done()
