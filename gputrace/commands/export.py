"""`gputrace export`: traces written as one partitioned dataset (docs/fleet.md)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from gputrace.errors import UsageError


def parse_storage_options(items: list[str] | None) -> dict[str, Any]:
    """`KEY=VALUE` pairs for the dataset's filesystem (fsspec storage options)."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--storage-option: expected KEY=VALUE, not {item!r}")
        out[key.strip()] = {"true": True, "false": False}.get(value.lower(), value)
    return out


STORAGE_HELP = ("Filesystem option KEY=VALUE for DEST (fsspec/s3fs, e.g. "
                "endpoint_url=http://host:9000, anon=true); repeatable.")


def register(app: typer.Typer) -> None:
    @app.command()
    def export(
        traces: Annotated[list[str], typer.Argument(help="Trace directories.")],
        to: Annotated[str, typer.Option(
            "--to", metavar="DEST", help="Dataset folder or URL (s3://bucket/prefix).")],
        storage_option: Annotated[list[str] | None, typer.Option(
            "--storage-option", metavar="KEY=VALUE", help=STORAGE_HELP)] = None,
    ) -> None:
        """Write traces as one dataset partitioned by date and host (incremental)."""
        from gputrace.fleet.export import export_traces
        from gputrace.fleet.store import Store

        if not to.strip():
            raise UsageError("--to: empty destination")
        store = Store(to, parse_storage_options(storage_option))
        done = export_traces(traces, store)
        typer.echo(f"{to}: {len(done.exported)} exported, {len(done.replaced)} replaced "
                   f"(changed since last export), {len(done.unchanged)} unchanged")
