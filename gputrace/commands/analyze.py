"""`gputrace analyze`: reports over a saved trace (no root, no GPU)."""

from __future__ import annotations

from typing import Annotated

import typer

from gputrace.errors import GputraceError


def register(app: typer.Typer) -> None:
    @app.command()
    def analyze(
        trace: Annotated[str, typer.Argument(help="Trace directory.")],
    ) -> None:
        """Leak, fault-rate, fragmentation and summary reports."""
        raise GputraceError("analyze is not built yet in this version")
