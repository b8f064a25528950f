"""How do a list's rows fit the terminal's width? A rich table whose columns are left
out from the right when they do not fit (never wrapped), a call stack cut with an
ellipsis, and at most `limit` rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from gputrace.render.cells import Fmt

ROWS = 20


Col = tuple[str, str, Fmt]


STACK_MIN = 24
"""Narrowest a trailing call-stack column gets before other columns are left out."""


def fit_columns(width: int, cols: Sequence[Col], cells: list[list[str]]
                ) -> tuple[list[int], list[int], bool]:
    """Which columns fit in `width` (indexes), the width of each, and whether the last is
    a free-text column (a call stack) that takes what is left, cut with an ellipsis.
    Columns are left out from the right, the first two (whose row it is) always stay,
    and nothing is ever wrapped, so a number is never broken over lines."""
    sizes = [max([cell_len(h), *(cell_len(row[i]) for row in cells)])
             for i, (_, h, _) in enumerate(cols)]
    last = len(cols) - 1
    free = cols[last][0] in STACK_KEYS
    keep = list(range(len(cols)))

    def used(i: int) -> int:
        return min(sizes[i], STACK_MIN) if free and i == last else sizes[i]

    while sum(used(i) for i in keep) + 3 * (len(keep) - 1) > width and len(keep) > 2:
        drop = keep[-2] if free and len(keep) > 3 else keep[-1]
        if free and drop == last:
            break
        keep.remove(drop)
    widths = [sizes[i] for i in keep]
    if free and last in keep:
        rest = width - sum(widths[:-1]) - 3 * (len(keep) - 1)
        widths[-1] = max(min(sizes[last], rest), min(sizes[last], STACK_MIN))
    return keep, widths, free


STACK_KEYS = ("frames", "site", "stack")


def table(con: Console, title: str, rows: Sequence[dict[str, Any]], cols: Sequence[Col],
          limit: int = ROWS) -> None:
    if not rows:
        con.print(Text(f"{title}: none", style="dim"))
        return
    cells = [[f(r.get(k)) for k, _, f in cols] for r in rows[:limit]]
    keep, widths, _ = fit_columns(con.width, cols, cells)
    t = Table(title=Text(title), title_justify="left", expand=False, show_edge=False,
              pad_edge=False)
    for i, w in zip(keep, widths, strict=True):
        # Nothing wraps: ids, numbers and kinds broken over lines are unreadable; a call
        # stack too long for the terminal is cut (the whole of it is in json and html).
        t.add_column(cols[i][1], no_wrap=True, overflow="ellipsis", width=w)
    for row in cells:
        t.add_row(*(Text(row[i]) for i in keep))
    con.print(t)
    left = [cols[i][1] for i in range(len(cols)) if i not in keep]
    if left:
        con.print(Text(f"(too narrow for: {', '.join(left)}; --format json or html has them)",
                       style="dim"))
    if len(rows) > limit:
        con.print(f"[dim]... {len(rows) - limit} more (use --rows or --format json)[/dim]")
