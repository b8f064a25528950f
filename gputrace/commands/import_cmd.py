"""`gputrace import torch-snapshot SNAPSHOT -o TRACE [--into RECORDING]`: a PyTorch
CUDA memory snapshot as a trace with an `allocator` layer (docs/importers.md)."""

from __future__ import annotations

from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    imp = typer.Typer(name="import", help="Make a trace from another tool's file.",
                      no_args_is_help=True, rich_markup_mode=None)
    app.add_typer(imp)

    @imp.command("torch-snapshot")
    def torch_snapshot(
        snapshot: Annotated[str, typer.Argument(
            help="torch.cuda.memory._dump_snapshot file (.pickle, .pickle.xz, .pickle.gz).")],
        output: Annotated[str, typer.Option("--output", "-o", help="Trace directory to write.")],
        into: Annotated[str | None, typer.Option(
            "--into", metavar="RECORDING",
            help="Join to this recording of the same process (written to -o, a copy).")
        ] = None,
        force: Annotated[bool, typer.Option(
            "--force", help="Replace an existing trace directory at -o.")] = False,
    ) -> None:
        """Import a PyTorch caching-allocator snapshot: segments, tensors, history.

        The pickle is read as plain data only: a file naming any Python global is
        refused, nothing in it runs.
        """
        from gputrace.importers.torch_snapshot import read_snapshot, system_pool, write_alone
        from gputrace.render.safe import printable

        with system_pool():  # the snapshot's rows are made and written on malloc
            snap = read_snapshot(snapshot)
            if into is None:
                path = write_alone(snap, output, force=force)
            else:
                from gputrace.importers.torch_join import write_joined

                path, join = write_joined(snap, into, output, force=force)
        r = snap.rows
        what = (f"{len(r.segments['address'])} segments, {len(r.blocks['address'])} blocks, "
                f"{r.event_count} trace entries, {len(r.stacks)} stacks")
        name = printable(snap.name)
        if into is None:
            typer.echo(printable(path) + f": {what} from {name}")
        else:
            typer.echo(f"{printable(path)}: {printable(into)} plus {what} from {name}; pid "
                       f"{join.pid}, {len(join.api_ts)} of {join.segments} segments matched "
                       "cuMemAlloc calls")
            if join.live:  # the recording's live allocator rows are kept: how they agree
                from gputrace.analyses.allocator.lineup import line_up_sources, lineup_text
                from gputrace.analyses.helpers.inputs import allocator_sources
                from gputrace.trace.reader import open_trace

                both = allocator_sources(open_trace(path))
                if both is not None:
                    frame = line_up_sources(both["live"]["allocator_blocks"],
                                            both["snapshot"]["allocator_blocks"])
                    for line in lineup_text(frame):
                        typer.echo(f"  {line}")
        for note in r.notes:
            typer.echo(f"  note: {note}")
