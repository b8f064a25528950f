"""gputrace: eBPF tracing and trace analysis for NVIDIA GPU memory."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from gputrace.trace.reader import Trace, open_trace
    from gputrace.trace.writer import TraceWriter

__all__ = ["Trace", "TraceWriter", "__version__", "open_trace"]


def __getattr__(name: str) -> Any:
    """The trace-directory names, imported on first use: `import gputrace.record...`
    then loads only what recording needs."""
    if name in ("Trace", "open_trace"):
        from gputrace.trace import reader as tracedir

        return getattr(tracedir, name)
    if name == "TraceWriter":
        from gputrace.trace.writer import TraceWriter

        return TraceWriter
    raise AttributeError(f"module 'gputrace' has no attribute {name!r}")
