"""Terminal section of the holders report: at each instant (the end of the trace,
each out-of-memory incident), one verdict line per case of memory no live process
owns, then the table of device-file holders. The same verdict lines stand in the leak
and oom reports (their `no_live_owner`). Formats; computes nothing.

Every string was made printable by the terminal renderer before it gets here, and
each is handed to rich as plain text, never markup.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

from gputrace.render import cells, term_table

HOLDER_COLS: list[term_table.Col] = [
    ("pid", "pid", cells.plain), ("comm", "comm", cells.plain), ("fds", "fds", cells.num),
    ("opened_by", "opened by (pid)", cells.pids), ("driver_bytes", "driver", cells.human_bytes)]
"""The holders table's columns, in the terminal and (same words) the HTML page."""


def where(inst: dict[str, Any]) -> str:
    """The instant an answer is for: the end of the trace or an incident."""
    gpu = "unknown" if inst["gpu_index"] is None else inst["gpu_index"]
    return ("at the end of the trace" if inst["at"] == "end"
            else f"at the incident at {inst['t_s']:.3f} s (GPU {gpu})")


def verdict_lines(inst: dict[str, Any], limit: int, *, none_line: bool = True
                  ) -> list[tuple[str, str]]:
    """(text, style) lines for one instant: the orphaned figure, one verdict per case,
    the cases not listed, and (`none_line`) why there are none."""
    hb = cells.human_bytes
    out = [(f"{where(inst)}: memory no live process owns: {hb(inst['orphaned_bytes'])}", "bold")]
    out += [(f"  {c['verdict']}", "red" if c["orphaned"] else "") for c in inst["cases"][:limit]]
    more = inst["left_out"]["cases"] + max(0, len(inst["cases"]) - limit)
    if more:
        out.append((f"  ... {cells.num(more)} more cases ({hb(inst['left_out']['cases_bytes'])} "
                    "not listed; use --rows or --format json)", "dim"))
    if not inst["cases"] and none_line:
        said = ("every process the driver charges is alive and traced"
                if inst["driver_accounting"] else "the driver's accounting not recorded")
        out.append((f"  none: no device file outlives its opener; {said}", "dim"))
    return out


def no_live_owner(con: Console, inst: dict[str, Any] | None, limit: int) -> None:
    """The verdict lines of memory no live process owns, in another report's section."""
    if inst is not None:
        for line, style in verdict_lines(inst, limit, none_line=False):
            con.print(Text(line, style=style))


def holders_section(con: Console, d: dict[str, Any], limit: int) -> None:
    """holders: per instant, the verdicts and who holds the device files."""
    for inst in d["instants"][:limit]:
        for line, style in verdict_lines(inst, limit):
            con.print(Text(line, style=style))
        term_table.table(con, "Device-file holders", inst["holders"], HOLDER_COLS, limit)
        if inst["left_out"]["holders"]:
            con.print(Text(f"... {cells.num(inst['left_out']['holders'])} more holders not "
                           "listed (--format json lists the first ones)", style="dim"))
