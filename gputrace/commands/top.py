"""`gputrace top`: `gputrace record --live` under a shorter name, for watching a
host or some processes (docs/live.md)."""

from __future__ import annotations

import tempfile
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command(epilog="Example:  sudo gputrace top -p 4242 --metrics 9400")
    def top(
        pid: Annotated[
            list[str] | None,
            typer.Option("--pid", "-p", help="Watch a running process (repeatable)."),
        ] = None,
        duration: Annotated[
            str | None, typer.Option("--duration", "-d", help="Stop after this long.")
        ] = None,
        output: Annotated[
            str | None,
            typer.Option("--output", "-o",
                         help="Trace directory (default: a new gputrace-top-* folder in the "
                              "temporary directory)."),
        ] = None,
        device_dir: Annotated[
            str, typer.Option("--device-dir", help="Folder holding the NVIDIA device files.")
        ] = "/dev",
        driver_version: Annotated[
            str | None,
            typer.Option("--driver-version", help="Driver version whose layouts to use."),
        ] = None,
        libcuda: Annotated[
            str | None, typer.Option("--libcuda", help="libcuda.so to probe besides those found.")
        ] = None,
        no_driver_layer: Annotated[
            bool, typer.Option("--no-driver-layer", help="No UVM tools trackers, no RM samples.")
        ] = False,
        metrics: Annotated[
            str | None,
            typer.Option("--metrics", metavar="[HOST:]PORT", help="Also serve Prometheus metrics."),
        ] = None,
        alert: Annotated[
            list[str] | None,
            typer.Option("--alert", metavar="EXPR", help="Alert once per episode (repeatable)."),
        ] = None,
        on_alert: Annotated[
            str | None, typer.Option("--on-alert", metavar="CMD", help="Run CMD per alert.")
        ] = None,
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
