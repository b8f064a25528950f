"""Terminal section of the holders report: at each instant (the end of the trace,
each out-of-memory incident), one verdict line per case of memory no live process
owns, then the table of device-file holders. Formats; computes nothing.

Every string was made printable by the terminal renderer before it gets here, and
each is handed to rich as plain text, never markup.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

from gputrace.render import cells, term_table


def _pids(v: Any) -> str:
    return ", ".join(str(p) for p in v) if v else "-"


def holders_section(con: Console, d: dict[str, Any], limit: int) -> None:
    """holders: per instant, the verdicts and who holds the device files."""
    hb, plain = cells.human_bytes, cells.plain
    for inst in d["instants"][:limit]:
        where = ("at the end of the trace" if inst["at"] == "end"
                 else f"at the incident at {inst['t_s']:.3f} s (GPU {inst['gpu_index']})")
        con.print(Text(f"{where}: memory no live process owns: {hb(inst['orphaned_bytes'])}",
                       style="bold"))
        for c in inst["cases"][:limit]:
            con.print(Text(f"  {c['verdict']}",
                           style="red" if c["orphaned"] else ""))
        more = inst["left_out"]
        if more["cases"]:
            con.print(Text(f"  ... {cells.num(more['cases'])} more cases "
                           f"({hb(more['cases_bytes'])}; --format json lists the first ones)",
                           style="dim"))
        if not inst["cases"]:
            said = ("every process the driver charges is alive and traced"
                    if inst["driver_accounting"] else "the driver's accounting not recorded")
            con.print(Text(f"  none: no device file outlives its opener; {said}",
                           style="dim"))
        term_table.table(con, "Device-file holders", inst["holders"], [
            ("pid", "pid", plain), ("comm", "comm", plain), ("fds", "fds", cells.num),
            ("opened_by", "opened by (pid)", _pids), ("driver_bytes", "driver", hb)], limit)
