"""gputrace: eBPF tracing and trace analysis for NVIDIA GPU memory."""

from __future__ import annotations

__version__ = "0.1.0"

from gputrace.tracedir import Trace, TraceWriter, open_trace

__all__ = ["Trace", "TraceWriter", "__version__", "open_trace"]
