"""The options `gputrace record` and `gputrace top` share, declared once."""

from __future__ import annotations

from typing import Annotated

import typer

PidOpt = Annotated[
    list[str] | None,
    typer.Option("--pid", "-p", help="Attach to a running process (repeatable)."),
]

DurationOpt = Annotated[
    str | None,
    typer.Option("--duration", "-d",
                 help="Stop after this long: seconds, or 500ms, 5m, 1h."),
]

DeviceDirOpt = Annotated[
    str, typer.Option("--device-dir", help="Folder holding the NVIDIA device files.")
]

DriverVersionOpt = Annotated[
    str | None,
    typer.Option("--driver-version", help="Driver version whose layouts to use."),
]

LibcudaOpt = Annotated[
    str | None,
    typer.Option("--libcuda", help="libcuda.so to probe besides those found (API layer)."),
]

NoDriverLayerOpt = Annotated[
    bool,
    typer.Option("--no-driver-layer",
                 help="No UVM tools trackers (GPU faults, migrations) and no RM "
                      "GPU memory samples."),
]

MetricsOpt = Annotated[
    str | None,
    typer.Option("--metrics", metavar="[HOST:]PORT",
                 help="Serve Prometheus metrics (a bare port: on 127.0.0.1)."),
]

AlertOpt = Annotated[
    list[str] | None,
    typer.Option("--alert", metavar="EXPR",
                 help="Alert once per episode, e.g. leak_rate>100MiB/min, "
                      "gpu_free<1GiB (repeatable; docs/live.md)."),
]

OnAlertOpt = Annotated[
    str | None,
    typer.Option("--on-alert", metavar="CMD",
                 help="Run CMD per alert, details in GPUTRACE_ALERT_* variables "
                      "(at most 4 at once; ended 5 s after the recording)."),
]
