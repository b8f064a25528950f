"""HTML section of the holders report: per instant (the end of the trace, each
out-of-memory incident) the verdict lines of memory no live process owns and the
device-file holders, every figure written as the terminal writes it
(render/holder_sections.py). Formats; computes nothing."""

from __future__ import annotations

from typing import Any

from gputrace.render.holder_sections import HOLDER_COLS, verdict_lines
from gputrace.render.html import Page, esc, table

LIMIT = 50
"""Cases and holders listed per instant on the page (the JSON lists what the report
kept)."""


def _cell(f: Any) -> Any:
    return lambda v: "" if v is None else esc(f(v))


def instant_html(inst: dict[str, Any], *, none_line: bool = True) -> str:
    """One instant's verdict lines, as paragraphs."""
    lines = verdict_lines(inst, LIMIT, none_line=none_line)
    return "".join(f'<p class="{"warn" if style == "red" else "note" if style == "dim" else ""}">'
                   f"{'<b>' + esc(t) + '</b>' if style == 'bold' else esc(t.strip())}</p>"
                   for t, style in lines)


def holders_html(page: Page, doc: dict[str, Any], s: dict[str, Any]) -> None:
    """Device-file holders and memory no live process owns (holders report)."""
    rep = doc.get("holders") or {}
    parts = [f'<p class="note">{esc(rep.get("question", ""))}</p>']
    for inst in rep.get("instants") or []:
        parts.append(instant_html(inst) + table(
            inst["holders"], [(k, title, _cell(f)) for k, title, f in HOLDER_COLS], LIMIT))
        if inst["left_out"]["holders"]:
            parts.append(f'<p class="note">{esc(inst["left_out"]["holders"])} more holders not '
                         "listed (--format json lists the first ones)</p>")
    page.section("Device-file holders", None, None, "".join(parts))
