"""`gputrace record`: trace NVIDIA device activity with eBPF (needs root and bcc)."""

from __future__ import annotations

from typing import Annotated

import typer

from gputrace.errors import GputraceError


def register(app: typer.Typer) -> None:
    @app.command(
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )
    def record(
        ctx: typer.Context,
        output: Annotated[str, typer.Option("--output", "-o", help="Trace directory.")] = (
            "gputrace.trace"
        ),
    ) -> None:
        """Record GPU memory activity into a trace directory (root)."""
        raise GputraceError("record is not built yet in this version")
