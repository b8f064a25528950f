"""`gputrace top`: `gputrace record --live` under a shorter name, for watching a
host or some processes (docs/live.md)."""

from __future__ import annotations

import tempfile
from typing import Annotated

import typer

from gputrace.commands.record_opts import (
    AlertOpt,
    DeviceDirOpt,
    DriverVersionOpt,
    DurationOpt,
    LibcudaOpt,
    MetricsOpt,
    NoDriverLayerOpt,
    OnAlertOpt,
    PidOpt,
)


def register(app: typer.Typer) -> None:
    @app.command(epilog="Example:  sudo gputrace top -p 4242 --metrics 9400")
    def top(
        pid: PidOpt = None,
        duration: DurationOpt = None,
        output: Annotated[
            str | None,
            typer.Option("--output", "-o",
                         help="Trace directory (default: a new gputrace-top-* folder in the "
                              "temporary directory)."),
        ] = None,
        device_dir: DeviceDirOpt = "/dev",
        driver_version: DriverVersionOpt = None,
        libcuda: LibcudaOpt = None,
        no_driver_layer: NoDriverLayerOpt = False,
        metrics: MetricsOpt = None,
        alert: AlertOpt = None,
        on_alert: OnAlertOpt = None,
    ) -> None:
        """Watch GPU memory live: per process and GPU, once a second (root).

        Same as `gputrace record --live`; with -p the given processes, else the host.
        """
        from gputrace.cli import main

        out = output or tempfile.mkdtemp(prefix="gputrace-top-") + "/trace"
        argv = ["record", "--live", "-o", out, "--device-dir", device_dir]
        argv += [a for p in pid or [] for a in ("-p", p)]
        argv += [] if duration is None else ["-d", duration]
        argv += [] if driver_version is None else ["--driver-version", driver_version]
        argv += [] if libcuda is None else ["--libcuda", libcuda]
        argv += ["--no-driver-layer"] if no_driver_layer else []
        argv += [] if metrics is None else ["--metrics", metrics]
        argv += [a for x in alert or [] for a in ("--alert", x)]
        argv += [] if on_alert is None else ["--on-alert", on_alert]
        rc = main(argv)
        if output is None:
            typer.echo(f"gputrace: the trace is in {out}", err=True)
        raise typer.Exit(rc)
