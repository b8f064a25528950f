"""`gputrace record`: trace NVIDIA device activity with eBPF (needs root and bcc)."""

from __future__ import annotations

import os
from typing import Annotated, Any

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

MAX_QUEUE_ENTRIES = 1 << 22
"""At most 4 Mi records (288 MiB of queue per traced process): past that a number
is a typo, and the queue is pinned memory."""

EPILOG = """Examples:

  gputrace record -o run1 -- python train.py     trace a command and its children

  gputrace record -o run2 -p 4242 -d 60          attach to a running process for 60 s

  gputrace record -o run3 --device-dir /tmp/dev -- ./workload /tmp/dev
                                                 a stand-in device folder (tests)

  gputrace record -o run4 --libcuda /opt/cuda/libcuda.so.1 -- ./app
                                                 probe a libcuda the loader cache lacks

  gputrace record -o run5 --no-driver-layer -- ./app
                                                 no UVM tools trackers, no RM memory samples

  gputrace record --ebpf                         print the BPF program and cflags
"""


def _flight(keep: list[str] | None, freeze_on: str | None, after: str | None, *,
            raw: bool, alerts: bool) -> Any:
    """The flight recorder's settings (record.freeze.Flight), every one checked."""
    from gputrace.errors import UsageError
    from gputrace.options import parse_duration_ns
    from gputrace.record.freeze import AFTER_NS, Flight, parse_triggers
    from gputrace.trace.window import MAX_KEEP_NS, parse_keep

    window = parse_keep(keep) if keep else None
    triggers = parse_triggers(freeze_on) if freeze_on is not None else frozenset()
    if after is not None and not triggers:
        raise UsageError("--after needs --freeze-on")
    after_ns = AFTER_NS if after is None else parse_duration_ns(
        after, "--after", minimum_ns=10**9, maximum_ns=MAX_KEEP_NS)  # fmt: skip
    if triggers and window is None:
        raise UsageError("--freeze-on needs --keep WINDOW: what an incident keeps before it")
    if triggers and raw:
        raise UsageError("--freeze-on watches the events as they are decoded: not with --raw")
    if "alert" in triggers and not alerts:
        raise UsageError("--freeze-on alert needs at least one --alert")
    return Flight(window, triggers, after_ns)


def register(app: typer.Typer) -> None:
    @app.command(
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        epilog=EPILOG,
    )
    def record(
        ctx: typer.Context,
        output: Annotated[str, typer.Option("--output", "-o", help="Trace directory.")] = (
            "gputrace.trace"
        ),
        pid: PidOpt = None,
        duration: DurationOpt = None,
        device_dir: DeviceDirOpt = "/dev",
        driver_version: DriverVersionOpt = None,
        force: Annotated[bool, typer.Option("--force", help="Overwrite the output.")] = False,
        libcuda: LibcudaOpt = None,
        no_driver_layer: NoDriverLayerOpt = False,
        uvm_queue_entries: Annotated[
            str | None,
            typer.Option("--uvm-queue-entries", metavar="N",
                         help="Records per UVM tools event queue, a power of two "
                              "(default: 64Ki)."),
        ] = None,
        sample_interval: Annotated[
            str | None,
            typer.Option("--sample-interval", metavar="DURATION",
                         help="How often GPU memory (heap free, largest free region) "
                              "is sampled from RM (default: 100ms)."),
        ] = None,
        pid_memory_interval: Annotated[
            str | None,
            typer.Option("--pid-memory-interval", metavar="DURATION",
                         help="How often the driver's per-process GPU memory is sampled "
                              "from RM (default: 1s; incidents sample it at once too)."),
        ] = None,
        stack_depth: Annotated[
            str | None,
            typer.Option("--stack-depth", metavar="N",
                         help="Frames kept of each allocation's user stack, 1 to 127 "
                              "(default: 127). Each frame costs the probe a read of user "
                              "memory on every allocation call."),
        ] = None,
        torch_stacks: Annotated[
            str,
            typer.Option("--torch-stacks", metavar="none|python|full",
                         help="Stack of each PyTorch tensor allocation (torch_allocator "
                              "layer): none, its Python frames (default), or Python and "
                              "native frames (costs more)."),
        ] = "python",
        uvm_queue_version: Annotated[
            str | None,
            typer.Option("--uvm-queue-version", metavar="1|2",
                         help="UVM tools queue record format (tests; default: the "
                              "driver's newest)."),
        ] = None,
        raw: Annotated[
            bool,
            typer.Option("--raw",
                         help="Write ioctl events undecoded (compressed as the probes "
                              "staged them): ~10x less recorder CPU per event on busy "
                              "hosts; `gputrace convert` decodes them later, anywhere. "
                              "No --live, --metrics or --alert."),
        ] = False,
        no_cache: Annotated[
            bool,
            typer.Option("--no-cache",
                         help="Compile the BPF programs and unwind tables afresh, neither "
                              "reading nor writing the caches in /var/cache/gputrace "
                              "(start-up takes seconds longer; docs/record.md)."),
        ] = False,
        ebpf: Annotated[
            bool, typer.Option("--ebpf", help="Print the BPF program and cflags, then exit.")
        ] = False,
        live: Annotated[
            bool, typer.Option("--live", help="A terminal view of the recording, once a second.")
        ] = False,
        metrics: MetricsOpt = None,
        alert: AlertOpt = None,
        on_alert: OnAlertOpt = None,
        keep: Annotated[
            list[str] | None,
            typer.Option("--keep", metavar="WINDOW",
                         help="Flight recorder: keep only the last WINDOW of the trace, a "
                              "time (15m, 1h) or a size (2GiB); older parts are deleted as "
                              "new ones are written (docs/flight-recorder.md)."),
        ] = None,
        freeze_on: Annotated[
            str | None,
            typer.Option("--freeze-on", metavar="oom[,alert]",
                         help="Keep the window before an incident (a failed allocation "
                              "for want of GPU memory; an --alert) and --after after it "
                              "as its own trace in TRACE/incidents/; recording goes on."),
        ] = None,
        after: Annotated[
            str | None,
            typer.Option("--after", metavar="DURATION",
                         help="What an incident keeps after it fires (default: 30s)."),
        ] = None,
        kube_root: Annotated[
            str,
            typer.Option("--kube-root", metavar="DIR",
                         help="The host root under which the node's /var/log/pods and "
                              "container runtime files are read for pod and container "
                              "names (default: /; a DaemonSet mounts them elsewhere)."),
        ] = "/",
    ) -> None:
        """Record GPU memory activity into a trace directory (root).

        With `-- CMD ARGS...` the command is started, traced with its children, and
        recording stops when it exits; with -p the given processes; else the host.
        """
        from gputrace.errors import UsageError
        from gputrace.options import parse_count, parse_duration_ns
        from gputrace.record.recorder import (
            MAX_DURATION_S,
            PID_MAX,
            Options,
            Recorder,
            build_program,
        )

        # every number is checked before anything is loaded or started
        pids = [parse_count(p, "-p", minimum=1, maximum=PID_MAX) for p in pid or []]
        duration_s = None
        if duration is not None:
            ns = parse_duration_ns(duration, "-d", minimum_ns=1_000_000,
                                   maximum_ns=int(MAX_DURATION_S) * 10**9)  # fmt: skip
            duration_s = ns / 1e9
        entries = Options.uvm_queue_entries
        if uvm_queue_entries is not None:
            entries = parse_count(uvm_queue_entries, "--uvm-queue-entries", minimum=2,
                                  maximum=MAX_QUEUE_ENTRIES)  # fmt: skip
            if entries & (entries - 1):
                raise UsageError(f"--uvm-queue-entries must be a power of two, not {entries}")
        sample_ms = Options.sample_ms
        if sample_interval is not None:
            sample_ms = parse_duration_ns(sample_interval, "--sample-interval",
                                          minimum_ns=1_000_000,
                                          maximum_ns=3600 * 10**9) / 1e6  # fmt: skip
        pid_ms = Options.pid_sample_ms
        if pid_memory_interval is not None:
            pid_ms = parse_duration_ns(pid_memory_interval, "--pid-memory-interval",
                                       minimum_ns=1_000_000,
                                       maximum_ns=3600 * 10**9) / 1e6  # fmt: skip
        depth = Options.stack_depth
        if stack_depth is not None:
            depth = parse_count(stack_depth, "--stack-depth", minimum=1,
                                maximum=Options.stack_depth)  # fmt: skip
        if torch_stacks not in ("none", "python", "full"):
            raise UsageError(f"--torch-stacks must be none, python or full, not {torch_stacks!r}")
        queue_version = None
        if uvm_queue_version is not None:
            queue_version = parse_count(uvm_queue_version, "--uvm-queue-version",
                                        minimum=1, maximum=2)  # fmt: skip

        if raw and (live or metrics is not None or alert):
            raise UsageError("--raw leaves ioctl events undecoded until `gputrace convert`: "
                             "it cannot be watched live (drop --live/--metrics/--alert)")
        flight = _flight(keep, freeze_on, after, raw=raw, alerts=bool(alert))
        if not os.path.isdir(kube_root):
            raise UsageError(f"--kube-root {kube_root}: no such directory")
        command = list(ctx.args)
        if command and command[0] == "--":
            command = command[1:]
        unknown = [a for a in command[:1] if a.startswith("-")]
        if unknown:
            raise UsageError(f"unknown option {unknown[0]} (put the command after --)")
        opts = Options(
            output=output,
            pids=pids,
            duration_s=duration_s,
            device_dir=device_dir,
            driver_version=driver_version,
            force=force,
            command=command,
            libcuda=libcuda,
            driver_layer=not no_driver_layer,
            uvm_queue_entries=entries,
            sample_ms=sample_ms,
            pid_sample_ms=pid_ms,
            uvm_queue_version=queue_version,
            stack_depth=depth,
            raw=raw,
            flight=flight,
            kube_root=kube_root,
            torch_stacks=torch_stacks,
            no_cache=no_cache,
        )
        if ebpf:
            from gputrace.record.api import libcuda as cuda

            source, flags, _drv, _plan = build_program(opts)
            typer.echo("// ---- syscall layer (one bcc program: tracepoints)")
            typer.echo(source)
            typer.echo("// cflags: " + " ".join(flags))
            typer.echo("// ---- API layer (one bcc program: uprobes on libcuda)")
            typer.echo(cuda.probe_source())
            typer.echo("// cflags: " + " ".join(cuda.cflags(stack_depth=depth)))
            from gputrace.record.torch_allocator import layer as torch_layer

            typer.echo("// ---- torch_allocator layer (appended to the API layer's program)")
            typer.echo(torch_layer.probe_source())
            typer.echo(f"// cflags: -DGT_TORCH_STACKS={torch_layer.STACKS[torch_stacks]}")
            raise typer.Exit(0)
        from gputrace.live import LiveOptions, run
        from gputrace.record import reap

        rc = run(Recorder(opts), LiveOptions(live, metrics, alert or [], on_alert))
        reap.exit_if_left(rc)  # a helper the kernel holds would hold the exit too
        raise typer.Exit(rc)
