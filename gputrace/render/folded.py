"""Bytes by call stack in the folded format of flamegraph.pl, speedscope and inferno.

One line per stack: frames from the root, separated by `;`, a space and the
bytes. The root frames are the layer (api, rm, uvm) and the process
(`comm (pid)`), so one file holds every layer without adding them up, and a
flame graph shows each process apart. A frame's own `;` becomes `:` (it would
split the frame) and control characters are escaped as on the terminal.
"""

from __future__ import annotations

from typing import Any

from gputrace.render.safe import printable


def _frame(name: str) -> str:
    return printable(name).replace(";", ":")


def render_folded(rows: list[dict[str, Any]]) -> str:
    """Folded lines of `rows` (`analyses.stacks_by_bytes.folded_stacks`), largest first."""
    lines = []
    for r in rows:
        path = [r["layer"], f"{r['comm']} ({r['pid']})", *r["frames"]]
        lines.append(";".join(_frame(f) for f in path) + f" {r['bytes']}")
    return "".join(line + "\n" for line in lines)
